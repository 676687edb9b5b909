// Package proxmoxfake is a small in-memory Proxmox VE API for tests of what drives the proxmox
// provider (the vps module's provider pools): the endpoints the provider calls (nodes, cluster
// resources and next id, clone, config, resize, start, stop, status, destroy, task status),
// answering as the API viewer documents ({"data": ...}; tasks as UPIDs, finished at once), with
// an API token it checks. It stands in for a real cluster, which tests never use.
package proxmoxfake

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// VM is a VM (or template) the fake holds.
type VM struct {
	VMID     int
	Node     string
	Name     string
	Template bool
	Status   string         // running, stopped
	Config   map[string]any // what config calls set
}

// API is the fake. Its URL + "/api2/json" is an account's endpoint.
type API struct {
	*httptest.Server
	token string
	nodes []string

	mu   sync.Mutex
	vms  map[int]*VM
	task int
}

// Start serves the fake until the test ends, with nodes and one template VM, 9000, named
// template on the first node; token is the one valid API token (USER@REALM!ID=SECRET).
func Start(t testing.TB, token, template string, nodes ...string) *API {
	a := &API{token: token, nodes: nodes, vms: map[int]*VM{}}
	a.vms[9000] = &VM{VMID: 9000, Node: nodes[0], Name: template, Template: true, Status: "stopped",
		Config: map[string]any{"name": template, "scsi0": "local-lvm:base-9000-disk-0,size=3G", "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0"}}
	a.Server = httptest.NewServer(http.HandlerFunc(a.serve))
	t.Cleanup(a.Close)
	return a
}

// Endpoint is the account endpoint to give the provider.
func (a *API) Endpoint() string { return a.URL + "/api2/json" }

// VMs returns the VMs (not templates), by VMID.
func (a *API) VMs() []VM {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []VM
	for _, v := range a.vms {
		if !v.Template {
			c := *v
			c.Config = map[string]any{}
			for k, x := range v.Config {
				c.Config[k] = x
			}
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].VMID < out[j].VMID })
	return out
}

// Remove destroys a VM behind the control plane's back.
func (a *API) Remove(vmid int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.vms, vmid)
}

func reply(w http.ResponseWriter, status int, data any, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	body := map[string]any{"data": data}
	if message != "" {
		body["message"] = message + "\n"
	}
	_ = json.NewEncoder(w).Encode(body)
}

var vmPath = regexp.MustCompile(`^/nodes/([^/]+)/qemu/([0-9]+)(/.*)?$`)

func (a *API) serve(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if r.Header.Get("Authorization") != "PVEAPIToken="+a.token {
		reply(w, http.StatusUnauthorized, nil, "authentication failure")
		return
	}
	path := strings.TrimPrefix(r.URL.Path, "/api2/json")
	var body map[string]any
	if r.Body != nil {
		_ = json.NewDecoder(r.Body).Decode(&body)
	}
	switch {
	case path == "/nodes" && r.Method == http.MethodGet:
		out := []map[string]any{}
		for _, n := range a.nodes {
			out = append(out, map[string]any{"node": n, "status": "online", "type": "node", "id": "node/" + n})
		}
		reply(w, 200, out, "")
	case path == "/cluster/resources" && r.Method == http.MethodGet:
		out := []map[string]any{}
		for _, v := range a.vms {
			tags, _ := v.Config["tags"].(string)
			tpl := 0
			if v.Template {
				tpl = 1
			}
			out = append(out, map[string]any{"id": fmt.Sprintf("qemu/%d", v.VMID), "type": "qemu", "vmid": v.VMID, "name": v.Name,
				"node": v.Node, "status": v.Status, "template": tpl, "tags": tags})
		}
		reply(w, 200, out, "")
	case path == "/cluster/nextid" && r.Method == http.MethodGet:
		id := 100
		for a.vms[id] != nil {
			id++
		}
		reply(w, 200, strconv.Itoa(id), "")
	case strings.HasPrefix(path, "/nodes/") && strings.Contains(path, "/tasks/") && strings.HasSuffix(path, "/status"):
		upid := strings.TrimSuffix(path[strings.Index(path, "/tasks/")+len("/tasks/"):], "/status")
		reply(w, 200, map[string]any{"upid": upid, "status": "stopped", "exitstatus": "OK"}, "")
	default:
		m := vmPath.FindStringSubmatch(path)
		if m == nil {
			reply(w, http.StatusNotImplemented, nil, "Method '"+r.Method+" "+path+"' not implemented")
			return
		}
		vmid, _ := strconv.Atoi(m[2])
		a.vm(w, r, m[1], vmid, m[3], body)
	}
}

func (a *API) upid(node, typ string, vmid int) string {
	a.task++
	return fmt.Sprintf("UPID:%s:%08X:0012C3D4:65E1F000:%s:%d:fake@pve!t:", node, a.task, typ, vmid)
}

func (a *API) vm(w http.ResponseWriter, r *http.Request, node string, vmid int, rest string, body map[string]any) {
	v := a.vms[vmid]
	if v == nil || v.Node != node {
		reply(w, http.StatusInternalServerError, nil, fmt.Sprintf("Configuration file 'nodes/%s/qemu-server/%d.conf' does not exist", node, vmid))
		return
	}
	switch {
	case rest == "/clone" && r.Method == http.MethodPost:
		newid := int(num(body["newid"]))
		if a.vms[newid] != nil {
			reply(w, http.StatusInternalServerError, nil, fmt.Sprintf("unable to create VM %d: config file already exists", newid))
			return
		}
		target, _ := body["target"].(string)
		if target == "" {
			target = node
		}
		name, _ := body["name"].(string)
		cfg := map[string]any{"name": name}
		for k, x := range v.Config {
			if k != "name" {
				cfg[k] = x
			}
		}
		a.vms[newid] = &VM{VMID: newid, Node: target, Name: name, Status: "stopped", Config: cfg}
		reply(w, 200, a.upid(node, "qmclone", vmid), "")
	case rest == "/config" && r.Method == http.MethodPost:
		for k, x := range body {
			v.Config[k] = x
		}
		reply(w, 200, a.upid(node, "qmconfig", vmid), "")
	case rest == "/config" && r.Method == http.MethodGet:
		reply(w, 200, v.Config, "")
	case rest == "/resize" && r.Method == http.MethodPut:
		disk, _ := body["disk"].(string)
		size, _ := body["size"].(string)
		v.Config[disk] = fmt.Sprintf("local-lvm:vm-%d-disk-0,size=%s", vmid, size)
		reply(w, 200, a.upid(node, "resize", vmid), "")
	case rest == "/status/current" && r.Method == http.MethodGet:
		reply(w, 200, map[string]any{"vmid": vmid, "name": v.Name, "status": v.Status}, "")
	case rest == "/status/start" && r.Method == http.MethodPost:
		v.Status = "running"
		reply(w, 200, a.upid(node, "qmstart", vmid), "")
	case rest == "/status/stop" && r.Method == http.MethodPost:
		v.Status = "stopped"
		reply(w, 200, a.upid(node, "qmstop", vmid), "")
	case rest == "" && r.Method == http.MethodDelete:
		if v.Status == "running" {
			reply(w, http.StatusInternalServerError, nil, fmt.Sprintf("VM %d is running - destroy failed", vmid))
			return
		}
		delete(a.vms, vmid)
		reply(w, 200, a.upid(node, "qmdestroy", vmid), "")
	default:
		reply(w, http.StatusNotImplemented, nil, "Method '"+r.Method+" "+r.URL.Path+"' not implemented")
	}
}

func num(v any) float64 {
	switch x := v.(type) {
	case float64:
		return x
	case string:
		f, _ := strconv.ParseFloat(x, 64)
		return f
	}
	return 0
}
