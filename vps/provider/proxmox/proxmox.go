// Package proxmox is the Proxmox VE provider of the vps module's provider pools, through
// github.com/luthermonson/go-proxmox. A server is a full clone of a template VM (the spec's
// image: the template's VMID or name), sized by the spec (cores, memory, the disk grown),
// given the SSH keys through Proxmox's own cloud-init drive, tagged better-compute and
// started; its id is node/vmid/name. List lists only VMs with that tag; since Proxmox reuses
// VMIDs, Delete and Reinstall act only on a VM of the id's name that carries the tag.
//
// Account options: node (required: where new VMs go, unless a spec names a location), storage
// (the clone's target storage), pool (a Proxmox resource pool), disk (the disk to grow,
// default scsi0), ciuser (cloud-init's user), ipconfig0 (default ip=dhcp) and caPEM (the
// certificates that sign the API's, e.g. /etc/pve/pve-root-ca.pem). The token is Proxmox's
// API token, USER@REALM!TOKENID=SECRET.
package proxmox

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	px "github.com/luthermonson/go-proxmox"

	"github.com/better-compute/compute/netpolicy"
	"github.com/better-compute/compute/vps/provider"
)

// Name is the provider's name in the API.
const Name = "proxmox"

// Tag marks the VMs this provider made.
const Tag = "better-compute"

// Defaults.
const (
	DefaultTimeout     = 30 * time.Second // one request
	DefaultTaskTimeout = 10 * time.Minute // one task: a full clone copies a disk
	DefaultDisk        = "scsi0"
	DefaultIPConfig    = "ip=dhcp"
)

// Provider drives Proxmox VE's API (https://pve.proxmox.com/pve-docs/api-viewer/). The zero
// value works.
type Provider struct {
	// HTTPClient, if set, sends the requests of accounts without caPEM in place of the
	// account's outbound policy's client, so its owner answers for where they go; default the
	// policy's client with DefaultTimeout.
	HTTPClient *http.Client
	// TaskTimeout bounds the wait for one task (clone, start, stop, destroy); default
	// DefaultTaskTimeout.
	TaskTimeout time.Duration
}

// New returns the provider with its defaults.
func New() *Provider { return &Provider{} }

var _ provider.Provider = (*Provider)(nil)

// Name implements provider.Provider.
func (*Provider) Name() string { return Name }

// conn is one account's client.
type conn struct {
	c    *px.Client
	a    provider.Account
	wait time.Duration
}

func (p *Provider) conn(a provider.Account) (*conn, error) {
	if a.Endpoint == "" {
		return nil, fmt.Errorf("proxmox: an account needs its endpoint, https://HOST:8006/api2/json: %w", provider.ErrInvalid)
	}
	id, secret, ok := strings.Cut(a.Token, "=")
	if !ok || !strings.Contains(id, "!") || secret == "" || strings.ContainsAny(a.Token, "\r\n\t ") {
		return nil, fmt.Errorf("proxmox: the token is not USER@REALM!TOKENID=SECRET: %w", provider.ErrUnauthorized)
	}
	hc := p.HTTPClient
	if hc == nil {
		hc = a.Outbound.Client(DefaultTimeout)
	}
	if pem := a.Options["caPEM"]; pem != "" {
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM([]byte(pem)) {
			return nil, fmt.Errorf("proxmox: option caPEM holds no PEM certificate: %w", provider.ErrInvalid)
		}
		hc = a.Outbound.Client(DefaultTimeout)
		hc.Transport.(*http.Transport).TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	}
	wait := p.TaskTimeout
	if wait <= 0 {
		wait = DefaultTaskTimeout
	}
	c := px.NewClient(strings.TrimRight(a.Endpoint, "/"), px.WithAPIToken(id, secret), px.WithHTTPClient(hc), px.WithUserAgent("better-compute"))
	return &conn{c: c, a: a, wait: wait}, nil
}

// mapErr maps Proxmox's answers onto the contract's errors. What Proxmox answered is summarised
// (its status), never repeated: the endpoint is the tenant's choice, and may be any service.
func mapErr(what string, err error) error {
	err = remote(err)
	var sentinel error
	switch {
	case px.IsNotAuthorized(err):
		sentinel = provider.ErrUnauthorized
	case px.IsBadRequest(err), px.IsNotFound(err):
		sentinel = provider.ErrInvalid
	default:
		return fmt.Errorf("proxmox: %s: %w", what, err) // a 5xx, a failed task, the network: worth a retry
	}
	return fmt.Errorf("proxmox: %s: %w: %w", what, sentinel, err)
}

// remote is err with its text a summary: the answer's status, or that a task failed.
func remote(err error) error {
	var api *px.APIError
	var task *px.TaskFailedError
	switch {
	case errors.As(err, &api):
		return netpolicy.Opaque("the API answered HTTP "+strconv.Itoa(api.StatusCode), err)
	case errors.As(err, &task):
		return netpolicy.Opaque("the task failed", err)
	case errors.Is(err, px.ErrTimeout):
		return netpolicy.Opaque("the task did not finish in time", err)
	}
	return netpolicy.Opaque("", err)
}

// Check implements provider.Provider: the token lists the cluster's nodes, and the account's
// node is among them.
func (p *Provider) Check(ctx context.Context, a provider.Account) error {
	k, err := p.conn(a)
	if err != nil {
		return err
	}
	node := a.Options["node"]
	if node == "" {
		return fmt.Errorf("proxmox: option node is required: the node new VMs go to: %w", provider.ErrInvalid)
	}
	var nodes []struct {
		Node string `json:"node"`
	}
	if err := k.c.Get(ctx, "/nodes", &nodes); err != nil {
		return mapErr("list nodes", err)
	}
	names := make([]string, len(nodes))
	for i, n := range nodes {
		names[i] = n.Node
	}
	if !slices.Contains(names, node) {
		return fmt.Errorf("proxmox: node %q is not in the cluster (%s): %w", node, strings.Join(names, ", "), provider.ErrInvalid)
	}
	return nil
}

// resources lists the cluster's VMs and templates (GET /cluster/resources?type=vm).
func (k *conn) resources(ctx context.Context) (px.ClusterResources, error) {
	rs, err := (&px.Cluster{}).New(k.c).Resources(ctx, "vm")
	if err != nil {
		return nil, mapErr("list the cluster's VMs", err)
	}
	return rs, nil
}

// template finds the template VM an image names, by VMID or by name.
func template(rs px.ClusterResources, image string) (*px.ClusterResource, error) {
	id, byID := strconv.ParseUint(image, 10, 64)
	for _, r := range rs {
		if r.Type == "qemu" && r.Template == 1 && ((byID == nil && r.VMID == id) || (byID != nil && r.Name == image)) {
			return r, nil
		}
	}
	return nil, fmt.Errorf("proxmox: no template VM %q in the cluster: %w", image, provider.ErrInvalid)
}

func (k *conn) waitTask(ctx context.Context, what string, upid px.UPID) error {
	t := px.NewTask(upid, k.c)
	if t == nil {
		return nil // an older Proxmox answered a synchronous call with no task
	}
	if err := t.Wait(ctx, time.Second, k.wait); err != nil {
		return mapErr(what, err)
	}
	return nil
}

// post sends a request whose answer is a task, and waits for it.
func (k *conn) post(ctx context.Context, what, method, path string, body any) error {
	var upid px.UPID
	var err error
	switch method {
	case http.MethodPut:
		err = k.c.Put(ctx, path, body, &upid)
	default:
		err = k.c.Post(ctx, path, body, &upid)
	}
	if err != nil {
		return mapErr(what, err)
	}
	return k.waitTask(ctx, what, upid)
}

// Create implements provider.Provider.
func (p *Provider) Create(ctx context.Context, a provider.Account, s provider.Spec) (provider.Server, error) {
	if s.Name == "" || s.Image == "" {
		return provider.Server{}, fmt.Errorf("proxmox: a server needs a name and an image (a template VM): %w", provider.ErrInvalid)
	}
	if s.UserData != "" {
		return provider.Server{}, fmt.Errorf("proxmox: Proxmox VE takes cloud-init user data only as a snippet file on the node (cicustom), which its API cannot write: give SSH keys instead: %w", provider.ErrInvalid)
	}
	k, err := p.conn(a)
	if err != nil {
		return provider.Server{}, err
	}
	node := s.Location
	if node == "" {
		node = a.Options["node"]
	}
	if node == "" {
		return provider.Server{}, fmt.Errorf("proxmox: no node: give the account option node or a location: %w", provider.ErrInvalid)
	}
	rs, err := k.resources(ctx)
	if err != nil {
		return provider.Server{}, err
	}
	for _, r := range rs {
		if r.Type == "qemu" && r.Template == 0 && r.Name == s.Name {
			return provider.Server{}, fmt.Errorf("proxmox: VM %d on %s is named %s: %w", r.VMID, r.Node, s.Name, provider.ErrExists)
		}
	}
	tpl, err := template(rs, s.Image)
	if err != nil {
		return provider.Server{}, err
	}
	vmid, err := (&px.Cluster{}).New(k.c).NextID(ctx)
	if err != nil {
		return provider.Server{}, mapErr("next VMID", err)
	}
	if err := k.clone(ctx, tpl, vmid, s.Name, node); err != nil {
		return provider.Server{}, err
	}
	if err := k.setUp(ctx, node, vmid, s); err != nil {
		// A half-made VM is removed, so that a retry does not find its name taken; if that fails
		// too, the retry adopts it by name.
		// The clone may not carry the tag yet, so it is destroyed without Delete's check.
		cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		st, derr := k.status(cleanup, node, vmid)
		if derr == nil && st != "" {
			derr = k.destroy(cleanup, node, vmid, st)
		}
		if derr != nil {
			return provider.Server{}, fmt.Errorf("%w (and removing the clone: %v)", err, derr)
		}
		return provider.Server{}, err
	}
	return provider.Server{ID: serverID(node, vmid, s.Name), Name: s.Name, Status: provider.StatusRunning}, nil
}

func (k *conn) clone(ctx context.Context, tpl *px.ClusterResource, vmid int, name, node string) error {
	opts := &px.VirtualMachineCloneOptions{NewID: vmid, Name: name, Full: true, Storage: k.a.Options["storage"], Pool: k.a.Options["pool"]}
	if node != tpl.Node {
		opts.Target = node
	}
	var upid px.UPID
	if err := k.c.Post(ctx, fmt.Sprintf("/nodes/%s/qemu/%d/clone", tpl.Node, tpl.VMID), opts, &upid); err != nil {
		return mapErr(fmt.Sprintf("clone template %d", tpl.VMID), err)
	}
	return k.waitTask(ctx, fmt.Sprintf("clone template %d", tpl.VMID), upid)
}

// setUp sizes, tags and keys a fresh clone, grows its disk and starts it.
func (k *conn) setUp(ctx context.Context, node string, vmid int, s provider.Spec) error {
	cfg := map[string]any{"tags": Tag, "description": description(s.Labels)}
	if s.VCPUs > 0 {
		cfg["cores"] = s.VCPUs
	}
	if s.MemoryMiB > 0 {
		cfg["memory"] = s.MemoryMiB
	}
	if len(s.SSHKeys) > 0 {
		cfg["sshkeys"] = px.EncodeSSHKeys(s.SSHKeys...)
	}
	if u := k.a.Options["ciuser"]; u != "" {
		cfg["ciuser"] = u
	}
	cfg["ipconfig0"] = DefaultIPConfig
	if ip := k.a.Options["ipconfig0"]; ip != "" {
		cfg["ipconfig0"] = ip
	}
	base := fmt.Sprintf("/nodes/%s/qemu/%d", node, vmid)
	if err := k.post(ctx, "configure VM "+strconv.Itoa(vmid), http.MethodPost, base+"/config", cfg); err != nil {
		return err
	}
	if s.DiskGiB > 0 {
		if err := k.post(ctx, "grow VM "+strconv.Itoa(vmid)+"'s disk", http.MethodPut, base+"/resize",
			map[string]string{"disk": k.disk(), "size": fmt.Sprintf("%dG", s.DiskGiB)}); err != nil {
			return err
		}
	}
	return k.post(ctx, "start VM "+strconv.Itoa(vmid), http.MethodPost, base+"/status/start", nil)
}

func (k *conn) disk() string {
	if d := k.a.Options["disk"]; d != "" {
		return d
	}
	return DefaultDisk
}

// description holds the spec's labels, one key=value a line, under the tag: what a person sees
// in Proxmox's UI.
func description(labels map[string]string) string {
	lines := []string{"Made by " + Tag + "."}
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		lines = append(lines, k+"="+labels[k])
	}
	return strings.Join(lines, "\n")
}

// serverID is node/vmid/name: Proxmox reuses a VMID once its VM is destroyed, so the name (which
// holds the instance's id) tells the VM that was made from another that took its number.
func serverID(node string, vmid int, name string) string {
	return node + "/" + strconv.Itoa(vmid) + "/" + name
}

var idRE = regexp.MustCompile(`^([A-Za-z0-9][A-Za-z0-9.-]*)/([1-9][0-9]{2,8})/([^/]+)$`)

func parseID(id string) (node string, vmid int, name string, err error) {
	m := idRE.FindStringSubmatch(id)
	if m == nil {
		return "", 0, "", fmt.Errorf("proxmox: %q is not a server id (node/vmid/name): %w", id, provider.ErrInvalid)
	}
	n, _ := strconv.Atoi(m[2])
	return m[1], n, m[3], nil
}

// vm is what this provider reads of a VM: its status and its configuration.
type vm struct {
	status string
	config map[string]any
}

// status reads a VM's status: running, stopped, or "" when it is gone.
func (k *conn) status(ctx context.Context, node string, vmid int) (string, error) {
	var st struct {
		Status string `json:"status"`
	}
	if err := k.c.Get(ctx, fmt.Sprintf("/nodes/%s/qemu/%d/status/current", node, vmid), &st); err != nil {
		if px.IsNotFound(err) {
			return "", nil
		}
		return "", mapErr(fmt.Sprintf("read VM %d", vmid), err)
	}
	return st.Status, nil
}

// ours reads a VM (nil when it is gone, or when its VMID now holds a VM of another name) and
// refuses one without the tag.
func (k *conn) ours(ctx context.Context, node string, vmid int, name string) (*vm, error) {
	st, err := k.status(ctx, node, vmid)
	if err != nil || st == "" {
		return nil, err
	}
	v := &vm{status: st}
	if err := k.c.Get(ctx, fmt.Sprintf("/nodes/%s/qemu/%d/config", node, vmid), &v.config); err != nil {
		if px.IsNotFound(err) {
			return nil, nil
		}
		return nil, mapErr(fmt.Sprintf("read VM %d's configuration", vmid), err)
	}
	if got, _ := v.config["name"].(string); got != name {
		return nil, nil // destroyed, and the VMID given to another VM since
	}
	tags, _ := v.config["tags"].(string)
	if !slices.Contains(strings.FieldsFunc(tags, func(r rune) bool { return r == ';' || r == ',' || r == ' ' }), Tag) {
		return nil, fmt.Errorf("proxmox: VM %d on %s is not tagged %s: it is not this control plane's: %w", vmid, node, Tag, provider.ErrInvalid)
	}
	return v, nil
}

// destroy stops a VM if it runs and destroys it with its disks.
func (k *conn) destroy(ctx context.Context, node string, vmid int, status string) error {
	base := fmt.Sprintf("/nodes/%s/qemu/%d", node, vmid)
	if status != "stopped" {
		if err := k.post(ctx, fmt.Sprintf("stop VM %d", vmid), http.MethodPost, base+"/status/stop", nil); err != nil {
			return err
		}
	}
	var upid px.UPID
	err := k.c.DeleteWithParams(ctx, base, &px.VirtualMachineDeleteOptions{Purge: true, DestroyUnreferencedDisks: true}, &upid)
	if px.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return mapErr(fmt.Sprintf("destroy VM %d", vmid), err)
	}
	return k.waitTask(ctx, fmt.Sprintf("destroy VM %d", vmid), upid)
}

// Delete implements provider.Provider.
func (p *Provider) Delete(ctx context.Context, a provider.Account, id string) error {
	node, vmid, name, err := parseID(id)
	if err != nil {
		return err
	}
	k, err := p.conn(a)
	if err != nil {
		return err
	}
	v, err := k.ours(ctx, node, vmid, name)
	if err != nil || v == nil {
		return err
	}
	return k.destroy(ctx, node, vmid, v.status)
}

// Reinstall implements provider.Provider. Proxmox has no rebuild: the VM is destroyed and the
// template cloned again under the same VMID and name, with the same cores, memory, keys, network
// card (its MAC: the same DHCP lease) and disk size, and started.
func (p *Provider) Reinstall(ctx context.Context, a provider.Account, id, image string) error {
	node, vmid, name, err := parseID(id)
	if err != nil {
		return err
	}
	k, err := p.conn(a)
	if err != nil {
		return err
	}
	v, err := k.ours(ctx, node, vmid, name)
	if err != nil {
		return err
	}
	if v == nil {
		return fmt.Errorf("proxmox: VM %s is gone: %w", id, provider.ErrInvalid)
	}
	rs, err := k.resources(ctx)
	if err != nil {
		return err
	}
	tpl, err := template(rs, image)
	if err != nil {
		return err
	}
	keep := map[string]any{}
	for _, key := range []string{"cores", "memory", "tags", "description", "sshkeys", "ciuser", "ipconfig0", "net0"} {
		if val, ok := v.config[key]; ok {
			keep[key] = val
		}
	}
	size := diskSize(v.config[k.disk()])
	if err := k.destroy(ctx, node, vmid, v.status); err != nil {
		return err
	}
	if err := k.clone(ctx, tpl, vmid, name, node); err != nil {
		return err
	}
	base := fmt.Sprintf("/nodes/%s/qemu/%d", node, vmid)
	if err := k.post(ctx, fmt.Sprintf("configure VM %d", vmid), http.MethodPost, base+"/config", keep); err != nil {
		return err
	}
	if size != "" {
		if err := k.post(ctx, fmt.Sprintf("grow VM %d's disk", vmid), http.MethodPut, base+"/resize", map[string]string{"disk": k.disk(), "size": size}); err != nil {
			return err
		}
	}
	return k.post(ctx, fmt.Sprintf("start VM %d", vmid), http.MethodPost, base+"/status/start", nil)
}

// diskSize reads size= of a disk's configuration ("local-lvm:vm-105-disk-0,size=32G").
func diskSize(v any) string {
	s, _ := v.(string)
	for _, part := range strings.Split(s, ",") {
		if size, ok := strings.CutPrefix(part, "size="); ok {
			return size
		}
	}
	return ""
}

// List implements provider.Provider: the cluster's QEMU VMs (not templates, not containers) tagged better-compute
// whose names start with prefix. Proxmox reports no addresses without a guest agent, so none
// are given.
func (p *Provider) List(ctx context.Context, a provider.Account, prefix string) ([]provider.Server, error) {
	k, err := p.conn(a)
	if err != nil {
		return nil, err
	}
	rs, err := k.resources(ctx)
	if err != nil {
		return nil, err
	}
	var out []provider.Server
	for _, r := range rs {
		if r.Type != "qemu" || r.Template != 0 || !strings.HasPrefix(r.Name, prefix) || !slices.Contains(strings.Split(r.Tags, ";"), Tag) {
			continue
		}
		st := provider.StatusOther
		switch r.Status {
		case "running":
			st = provider.StatusRunning
		case "stopped":
			st = provider.StatusStopped
		}
		out = append(out, provider.Server{ID: serverID(r.Node, int(r.VMID), r.Name), Name: r.Name, Status: st})
	}
	return out, nil
}
