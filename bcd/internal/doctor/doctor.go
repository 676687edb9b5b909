// Package doctor checks what a node needs to work, and says what to fix: its identity and
// certificate, its clock, the gateway, NVML, MIG, cgroup v2, the CDI directory and its disk.
// Report is its machine-readable form (bcd doctor --json), a stable shape that scripts may read.
package doctor

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/better-compute/compute/bcd/internal/cgroup"
	"github.com/better-compute/compute/bcd/internal/hardware"
	"github.com/better-compute/compute/bcd/internal/journal"
	"github.com/better-compute/compute/internal/node/nodeagent"
)

// Check is one finding: its name (identity, certificate, clock, gateway, nvml, mig, cgroup, cdi,
// disk), its status, what was found and, unless it is ok, what to do about it.
type Check struct {
	Name   string `json:"name"`
	Status string `json:"status"` // ok, warn, fail, or skip (does not apply here)
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"` // the advice
	// Data is what the check read, for the checks that read more than a sentence says: mig
	// ([]MIGGPU) and cgroup (Cgroup).
	Data any `json:"data,omitempty"`
}

// Check statuses.
const (
	OK   = "ok"
	Warn = "warn"
	Fail = "fail"
	Skip = "skip"
)

// ReportVersion is the version of Report's shape; it changes only when a field changes meaning
// or goes away.
const ReportVersion = 1

// Report is bcd doctor --json: whether the node is fit (no check failed) and every check, in a
// fixed order.
type Report struct {
	Version int     `json:"version"`
	OK      bool    `json:"ok"`
	Checks  []Check `json:"checks"`
}

// NewReport is the report of checks.
func NewReport(checks []Check) Report {
	return Report{Version: ReportVersion, OK: !Failed(checks), Checks: checks}
}

// Options say where to look.
type Options struct {
	StateDir string
	CDIDir   string
	Gateway  string // overrides the gateways of the join
	// Transport is the node's (nodeagent's TransportAuto, TransportGRPC, TransportWebSocket):
	// held to gRPC, a gateway reached only over HTTP/1.1 fails the gateway check.
	Transport string
	// Running describes a bcd node that holds the journal: its status stands in for the journal.
	Running *Running
	// SkipGPUs leaves NVML alone (fake hardware).
	SkipGPUs bool
	// OpenGPUs opens the machine's GPUs; default hardware.OpenSystemGPUs.
	OpenGPUs func() (hardware.GPUs, error)
	// Cgroup is the cgroup v2 hierarchy to check; the zero value is the machine's.
	Cgroup cgroup.Tree
}

// Running is what a running node's status file says.
type Running struct {
	NodeID, NodeName, URL, Gateway, Transport, LastError string
	Connected                                            bool
	CertNotAfter                                         time.Time
}

// Failed reports whether any check failed.
func Failed(cs []Check) bool {
	for _, c := range cs {
		if c.Status == Fail {
			return true
		}
	}
	return false
}

// Run runs every check.
func Run(ctx context.Context, o Options) []Check {
	var out []Check
	if r := o.Running; r != nil {
		out = append(out, Check{Name: "identity", Status: "ok", Detail: fmt.Sprintf("node %s (%s), run by a bcd node that holds the journal", r.NodeName, r.NodeID)},
			expiry(r.CertNotAfter), clock(ctx, r.URL), session(r))
	} else {
		id, idCheck := identity(o)
		out = append(out, idCheck)
		if id != nil {
			out = append(out, certificate(id), clock(ctx, id.URL), gateway(ctx, id, o.Gateway, o.Transport))
		} else {
			// Every check has its place in every report, so that a script finds it there.
			for _, name := range []string{"certificate", "clock", "gateway"} {
				out = append(out, Check{Name: name, Status: Skip, Detail: "the node has no identity to check it with"})
			}
		}
	}
	if o.SkipGPUs {
		out = append(out, Check{Name: "nvml", Status: Skip, Detail: "fake hardware: NVML is not read"},
			Check{Name: "mig", Status: Skip, Detail: "fake hardware: NVML is not read"})
	} else {
		out = append(out, gpus(o.OpenGPUs)...)
	}
	out = append(out, cgroupCheck(o.Cgroup), cdiDir(o.CDIDir), disk(o.StateDir))
	return out
}

// session is the gateway check of a running node: its session is the proof.
func session(r *Running) Check {
	c := Check{Name: "gateway"}
	if r.Connected {
		c.Status, c.Detail = "ok", "the running node holds a session with "+r.Gateway
		if r.Transport != "" {
			c.Detail += " over " + r.Transport
		}
		return c
	}
	c.Status, c.Detail = "fail", "the running node has no session: "+r.LastError
	c.Fix = "check the gateway address and the firewall (bcd dials out); a refused certificate means the node was retired or its certificate revoked: join again"
	return c
}

func identity(o Options) (*nodeagent.Identity, Check) {
	c := Check{Name: "identity"}
	j, err := journal.OpenReadOnly(o.StateDir)
	if err != nil {
		c.Status, c.Detail, c.Fix = "fail", err.Error(), "run bcd join --url URL --token TOKEN"
		return nil, c
	}
	defer j.Close()
	id, ok, err := j.Identity()
	switch {
	case err != nil:
		c.Status, c.Detail, c.Fix = "fail", err.Error(), "the journal does not read: move "+journal.Path(o.StateDir)+" aside and join again"
		return nil, c
	case !ok:
		c.Status, c.Detail, c.Fix = "fail", "the node has not joined", "run bcd join --url URL --token TOKEN"
		return nil, c
	}
	c.Status, c.Detail = "ok", fmt.Sprintf("node %s (%s)", id.NodeName, id.NodeID)
	return &id, c
}

func certificate(id *nodeagent.Identity) Check {
	cert, err := x509.ParseCertificate(id.CertDER)
	if err != nil {
		return Check{Name: "certificate", Status: "fail", Detail: "the node's certificate does not parse: " + err.Error(), Fix: "join again"}
	}
	return expiry(cert.NotAfter)
}

func expiry(notAfter time.Time) Check {
	c := Check{Name: "certificate"}
	left := time.Until(notAfter)
	switch {
	case left <= 0:
		c.Status, c.Detail = "fail", fmt.Sprintf("expired %s ago", (-left).Round(time.Second))
		c.Fix = "a node renews its certificate over its session; one that was away longer than a certificate's life joins again (bcd join with a new token)"
	case left < time.Hour:
		c.Status, c.Detail, c.Fix = "warn", fmt.Sprintf("expires in %s", left.Round(time.Second)), "keep bcd node running: it renews the certificate"
	default:
		c.Status, c.Detail = "ok", fmt.Sprintf("valid until %s (%s left)", notAfter.Format(time.RFC3339), left.Round(time.Minute))
	}
	return c
}

// clock compares the local clock with the control plane's (its HTTP Date header).
func clock(ctx context.Context, url string) Check {
	c := Check{Name: "clock"}
	if url == "" {
		c.Status, c.Detail = "warn", "the join did not record the control plane's URL: the clock cannot be compared"
		return c
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/api/compute/methods", nil)
	before := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.Status, c.Detail, c.Fix = "warn", "the control plane at "+url+" did not answer: "+err.Error(), "check the network to the control plane"
		return c
	}
	resp.Body.Close()
	theirs, err := http.ParseTime(resp.Header.Get("Date"))
	if err != nil {
		c.Status, c.Detail = "warn", "the control plane sent no Date header"
		return c
	}
	mine := before.Add(time.Since(before) / 2)
	skew := mine.Sub(theirs)
	if skew < 0 {
		skew = -skew
	}
	// Date has a resolution of a second.
	switch {
	case skew > 30*time.Second:
		c.Status, c.Detail, c.Fix = "fail", fmt.Sprintf("the clock is %s off the control plane's", skew.Round(time.Second)), "run an NTP client (chrony or systemd-timesyncd): certificates and reservations depend on the time"
	case skew > 2*time.Second:
		c.Status, c.Detail, c.Fix = "warn", fmt.Sprintf("the clock is %s off the control plane's", skew.Round(time.Second)), "run an NTP client"
	default:
		c.Status, c.Detail = "ok", "within a second or two of the control plane's"
	}
	return c
}

// gateway dials the gateway and completes a mutual TLS handshake with the node's certificate,
// offering HTTP/2 as gRPC does; where that does not get through, it tries HTTP/1.1, which the
// WebSocket fallback uses: a warning in auto and websocket mode (sessions work, over the
// fallback), a failure when the node is held to gRPC.
func gateway(ctx context.Context, id *nodeagent.Identity, override, transport string) Check {
	c := Check{Name: "gateway"}
	addrs := id.Gateways
	if override != "" {
		addrs = []string{override}
	}
	if len(addrs) == 0 {
		c.Status, c.Detail, c.Fix = "fail", "no gateway address", "pass --gateway host:port"
		return c
	}
	key, err := x509.ParsePKCS8PrivateKey(id.KeyDER)
	if err != nil {
		c.Status, c.Detail, c.Fix = "fail", "the node's key does not parse", "join again"
		return c
	}
	pool := x509.NewCertPool()
	for _, der := range id.CADER {
		if ca, err := x509.ParseCertificate(der); err == nil {
			pool.AddCert(ca)
		}
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pool, NextProtos: []string{"h2"},
		Certificates: []tls.Certificate{{Certificate: [][]byte{id.CertDER}, PrivateKey: key}}}
	http1 := cfg.Clone()
	http1.NextProtos = []string{"http/1.1"}
	var errs []error
	for _, a := range addrs {
		err := handshake(ctx, a, cfg)
		if err == nil {
			c.Status, c.Detail = "ok", "mutual TLS handshake with "+a
			return c
		}
		errs = append(errs, fmt.Errorf("%s: %w", a, err))
		if transport == nodeagent.TransportGRPC {
			continue
		}
		if handshake(ctx, a, http1) == nil {
			c.Status = Warn
			c.Detail = fmt.Sprintf("HTTP/2 does not get through to %s (%v), HTTP/1.1 does: sessions use the WebSocket fallback", a, err)
			c.Fix = "let HTTP/2 (ALPN h2) through to the gateway for gRPC, or keep to the fallback (bcd node --transport auto or websocket)"
			return c
		}
	}
	c.Status, c.Detail = "fail", errors.Join(errs...).Error()
	c.Fix = "check the address and the firewall (bcd dials out to the gateway); a refused certificate means the node was retired or its certificate revoked: join again"
	return c
}

// handshake completes a TLS handshake with addr, and a first read: TLS 1.3 reports a refused
// client certificate on it.
func handshake(ctx context.Context, addr string, cfg *tls.Config) error {
	d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second}, Config: cfg}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	_, err = conn.Read(make([]byte, 1))
	var ne net.Error
	if err == nil || errors.As(err, &ne) && ne.Timeout() {
		return nil
	}
	return err
}

func cdiDir(dir string) Check {
	c := Check{Name: "cdi"}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		c.Status, c.Detail, c.Fix = "fail", err.Error(), "create "+dir+" or run bcd as a user that may"
		return c
	}
	f, err := os.CreateTemp(dir, ".bcd-doctor-*")
	if err != nil {
		c.Status, c.Detail, c.Fix = "fail", dir+" is not writable: "+err.Error(), "bcd writes CDI specs there: run it as a user that may"
		return c
	}
	f.Close()
	os.Remove(f.Name())
	c.Status, c.Detail = "ok", dir+" is writable"
	return c
}

func disk(dir string) Check {
	c := Check{Name: "disk"}
	var st syscall.Statfs_t
	if err := syscall.Statfs(filepath.Clean(dir), &st); err != nil {
		c.Status, c.Detail = "warn", "cannot read the file system of "+dir+": "+err.Error()
		return c
	}
	free := float64(st.Bavail) / float64(st.Blocks)
	detail := fmt.Sprintf("%.0f%% free on the file system of %s", free*100, dir)
	switch {
	case free < 0.02:
		c.Status, c.Detail, c.Fix = "fail", detail, "free space: the journal must be able to write"
	case free < 0.10:
		c.Status, c.Detail, c.Fix = "warn", detail, "free some space"
	default:
		c.Status, c.Detail = "ok", detail
	}
	return c
}
