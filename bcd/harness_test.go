package main

// The end-to-end tests' setup, written once: the bcd binary, built once for the test binary; a
// control plane with its API on loopback, a gateway, and a pool with a join token; bcd processes
// (and the tests' other processes) whose output, with the control plane's log, is kept in one
// computetest.Buffer per test and shown when the test fails.

import (
	"context"
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/bcd/internal/daemon"
	"github.com/better-compute/compute/bcd/internal/tenancy"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/postgres/pgtest"
)

func TestMain(m *testing.M) {
	flag.Parse()
	// These tests wait on processes far more than they compute: all of them at once rather than
	// GOMAXPROCS at a time (2 on a 2-core machine), unless -parallel says otherwise.
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", "16")
	}
	code := pgtest.Run(m)
	if builds.dir != "" {
		_ = os.RemoveAll(builds.dir)
	}
	os.Exit(code)
}

// e2eWait is how long a test waits for a real process to do what it was asked: long enough for
// a loaded machine running every test of the package at once.
const e2eWait = time.Minute

// builds are the binaries built for this test binary, each once, in a directory every user may
// walk (the helper test runs bcd as nobody), removed by TestMain.
var builds struct {
	mu   sync.Mutex
	dir  string
	each map[string]*build
}

type build struct {
	once sync.Once
	path string
	out  []byte
	err  error
}

// goBuild builds the package pkg (relative to bcd/) with flags as name, once for the test binary.
func goBuild(t testing.TB, name, pkg string, flags ...string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the bcd binary")
	}
	b, err := buildOf(name)
	if err != nil {
		t.Fatal(err)
	}
	b.once.Do(func() { b.build(pkg, flags) })
	if b.err != nil {
		t.Fatalf("go build %s (%s): %v\n%s", pkg, name, b.err, b.out)
	}
	return b.path
}

// prebuild starts goBuild's build in the background, for a test that needs the binary later
// (whose goBuild then waits for it).
func prebuild(name, pkg string, flags ...string) {
	if b, err := buildOf(name); err == nil && !testing.Short() {
		go b.once.Do(func() { b.build(pkg, flags) })
	}
}

// buildOf is the build named name, made in the builds' directory on first use.
func buildOf(name string) (*build, error) {
	builds.mu.Lock()
	defer builds.mu.Unlock()
	if builds.dir == "" {
		dir, err := os.MkdirTemp("", "bcd-e2e-")
		if err == nil {
			err = os.Chmod(dir, 0o755)
		}
		if err != nil {
			return nil, err
		}
		builds.dir, builds.each = dir, map[string]*build{}
	}
	b := builds.each[name]
	if b == nil {
		b = &build{path: filepath.Join(builds.dir, name)}
		builds.each[name] = b
	}
	return b, nil
}

func (b *build) build(pkg string, flags []string) {
	args := append(append([]string{"build"}, flags...), "-o", b.path, pkg)
	b.out, b.err = exec.Command("go", args...).CombinedOutput()
}

// bcdBinary is the bcd binary.
func bcdBinary(t testing.TB) string { return goBuild(t, "bcd", ".") }

// bcdVersion is the bcd binary reporting version.
func bcdVersion(t testing.TB, version string) string {
	return goBuild(t, "bcd-"+version, ".", "-ldflags", "-X github.com/better-compute/compute/bcd/app.version="+version)
}

// e2ePool is the pool of the end-to-end control plane, and e2eGPUs the fake GPUs its nodes have.
const (
	e2ePool = "h100"
	e2eGPUs = 8
)

// e2eOptions change an end-to-end setup. Zero values mean the defaults.
type e2eOptions struct {
	Modules []compute.Module
	// Listener is where the API is served, for a module that must know its URL before the
	// control plane is built (computetest.Listener); default a new one.
	Listener net.Listener
	// TokenUses is how many nodes the join token joins; default 1.
	TokenUses int
	// NoGateway is for a test that runs no node: no gateway, and no background work.
	NoGateway bool
}

// e2e is a control plane for real bcd processes: its API served on loopback, a gateway, pool
// e2ePool with a join token, and the log of the test's processes.
type e2e struct {
	*computetest.Env
	t       *testing.T
	Bin     string // the bcd binary
	API     *compute.API
	URL     string        // the API's
	Gateway string        // the address nodes dial
	Token   api.JoinToken // joins nodes to e2ePool
	// Log is the control plane's log and the output of every process the test started, each
	// line prefixed with whose it is; the test's log shows it if the test fails.
	Log *computetest.Buffer
}

// newE2E builds the bcd binary (once) and starts a control plane for t.
func newE2E(t *testing.T, opts e2eOptions) *e2e {
	t.Helper()
	e := &e2e{t: t, Bin: bcdBinary(t), Log: &computetest.Buffer{}}
	// The first cleanup runs last: after every process is gone and its output read.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the control plane's log and the processes' output:\n%s", e.Log)
		}
	})
	e.Env = computetest.New(t, computetest.Options{Modules: opts.Modules, Configure: func(o *compute.Options) {
		o.HeartbeatInterval = 300 * time.Millisecond
		o.Logger = slog.New(slog.NewTextHandler(e.output("control plane"), nil))
	}})
	e.API = e.Compute.API
	ln := opts.Listener
	if ln == nil {
		ln = computetest.Listener(t)
	}
	e.URL = e.Serve(t, ln)
	if !opts.NoGateway {
		e.Gateway, _ = e.Env.Gateway(t, "")
	}
	ctx := context.Background()
	if _, err := e.API.Pools.Create(ctx, e.RootKey, api.CreatePool{Name: e2ePool}); err != nil {
		t.Fatal(err)
	}
	tok, err := e.API.JoinTokens.Create(ctx, e.RootKey, api.CreateJoinToken{Pool: e2ePool, MaxUses: max(opts.TokenUses, 1)})
	if err != nil {
		t.Fatal(err)
	}
	e.Token = tok
	return e
}

// output is a writer into the log whose lines are prefixed with name.
func (e *e2e) output(name string) io.Writer { return &prefixWriter{w: e.Log, prefix: name + ": "} }

// prefixWriter prefixes each line written with prefix. One writer is one process's output, which
// exec.Cmd writes from one goroutine at a time.
type prefixWriter struct {
	w      io.Writer
	prefix string
	mid    bool // within a line
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	n := len(b)
	var out []byte
	for len(b) > 0 {
		if !p.mid {
			out = append(out, p.prefix...)
		}
		i := slices.Index(b, '\n') + 1
		if i == 0 {
			i = len(b)
		}
		out, b = append(out, b[:i]...), b[i:]
		p.mid = out[len(out)-1] != '\n'
	}
	if _, err := p.w.Write(out); err != nil {
		return 0, err
	}
	return n, nil
}

// waitLog waits for line in the log: for a process to say it, or, where it said so before it
// did what the test saw (a process logs, then answers), for its output to be copied into the log.
func (e *e2e) waitLog(what, line string) {
	e.t.Helper()
	computetest.Eventually(e.t, e2eWait, what, func() bool { return e.Log.Contains(line) })
}

// proc is a process the test started.
type proc struct {
	*exec.Cmd
	done chan struct{} // closed once it has exited and its output is read
}

// start starts cmd with its output in the log as name's, in a process group of its own that is
// killed when the test ends (a supervisor and the bcd it runs, a wrapper and what it wraps).
func (e *e2e) start(name string, cmd *exec.Cmd) *proc {
	e.t.Helper()
	if cmd.Stdout == nil && cmd.Stderr == nil {
		w := e.output(name)
		cmd.Stdout, cmd.Stderr = w, w
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	// What it started in sessions of their own (a tunnel's command, sshd's logins) may hold its
	// output open after it is killed.
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Start(); err != nil {
		e.t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{Cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	e.t.Cleanup(p.kill)
	return p
}

// kill kills the process and its group, and waits for it.
func (p *proc) kill() {
	_ = syscall.Kill(-p.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// nodeOptions say how a node is joined and run. Zero values mean the defaults.
type nodeOptions struct {
	Name    string   // its hostname; default "node"
	State   string   // its state directory; default a new one
	CDIDir  string   // where it writes CDI specs; default a new directory
	Gateway string   // the address it dials; default the gateway's
	Args    []string // more flags of bcd node (it runs with --fake-gpus e2eGPUs, --log-level info)
	Under   []string // a command that runs it (unshare … --); default none
	UID     int      // the user it joins and runs as, when not 0; default the test's
}

// node is a joined bcd node.
type node struct {
	*proc
	e     *e2e
	opts  nodeOptions
	State string
	CDI   string
}

// node joins a node with the join token and starts bcd node for it.
func (e *e2e) node(opts nodeOptions) *node {
	e.t.Helper()
	if opts.Name == "" {
		opts.Name = "node"
	}
	if opts.State == "" {
		opts.State = e.t.TempDir()
	}
	if opts.CDIDir == "" {
		opts.CDIDir = e.t.TempDir()
	}
	if opts.Gateway == "" {
		opts.Gateway = e.Gateway
	}
	if out, err := e.command(opts.UID, "join", "--state-dir", opts.State, "--url", e.URL, "--token", e.Token.Token, "--hostname", opts.Name).CombinedOutput(); err != nil {
		e.t.Fatalf("bcd join: %v\n%s", err, out)
	}
	if opts.UID == 0 {
		e.idRange(opts.State)
	}
	n := &node{e: e, opts: opts, State: opts.State, CDI: opts.CDIDir}
	n.restart()
	return n
}

// nodeIDs counts the nodes given a range of ids of their own, from this test binary's base.
var nodeIDs = func() *atomic.Int32 {
	var n atomic.Int32
	n.Store(idBase())
	return &n
}()

// idBase is this test binary's first node number: a machine-wide counter under an flock, so that
// two binaries at once (go test -count=3 ./... twice) give their nodes ranges that never meet.
// Blocks of 50 nodes, 500 of them before it wraps, ranges 100,000 ids wide, all below 2^31.
func idBase() int32 {
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "better-compute-bcd-id-bases"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		panic(err)
	}
	defer f.Close() // and with it the lock
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		panic(err)
	}
	b, _ := io.ReadAll(f)
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if err := f.Truncate(0); err != nil {
		panic(err)
	}
	if _, err := f.WriteAt([]byte(strconv.Itoa((n+1)%500)+"\n"), 0); err != nil {
		panic(err)
	}
	return int32(n) * 50
}

// idRange gives the node of state a range of uids and gids of its own for its holders' users
// and its devices' groups (tenancy.json's next id). Each bcd takes the first id free on the
// machine; two of them (never so outside tests) could take the same one at once, and the
// second groupadd would fail.
func (e *e2e) idRange(state string) {
	e.t.Helper()
	first := tenancy.FirstID + int(nodeIDs.Add(1))*100_000
	b, _ := json.Marshal(map[string]any{"users": map[string]any{}, "nextId": first})
	if err := os.WriteFile(filepath.Join(state, "tenancy.json"), b, 0o600); err != nil {
		e.t.Fatal(err)
	}
}

// restart starts bcd node again, as it was started first (after kill).
func (n *node) restart() {
	n.e.t.Helper()
	o := n.opts
	args := append([]string{"node", "--state-dir", o.State, "--cdi-dir", o.CDIDir, "--gateway", o.Gateway, "--fake-gpus", strconv.Itoa(e2eGPUs), "--log-level", "info"}, o.Args...)
	cmd := n.e.command(o.UID, args...)
	if len(o.Under) > 0 {
		cmd = asUser(exec.Command(o.Under[0], slices.Concat(o.Under[1:], []string{n.e.Bin}, args)...), o.UID)
	}
	n.proc = n.e.start("bcd node "+o.Name, cmd)
}

// command is bcd with args, run as uid when not 0.
func (e *e2e) command(uid int, args ...string) *exec.Cmd {
	return asUser(exec.Command(e.Bin, args...), uid)
}

// asUser runs cmd as uid (and its gid), when it is not 0 or this process's.
func asUser(cmd *exec.Cmd, uid int) *exec.Cmd {
	if uid != 0 && uid != os.Geteuid() {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	}
	return cmd
}

// online waits for the node named name to be online with its e2eGPUs GPUs, and returns its id.
func (e *e2e) online(name string) string {
	e.t.Helper()
	ctx := context.Background()
	var id string
	computetest.Eventually(e.t, e2eWait, "node "+name+" online with its GPUs", func() bool {
		list, err := e.API.Nodes.List(ctx, e.RootKey, api.ListNodes{Pool: e2ePool})
		if err != nil {
			return false
		}
		for _, n := range list.Items {
			if n.Name == name && n.Status == api.NodeOnline {
				devs, err := e.API.Devices.List(ctx, e.RootKey, api.ListDevices{Node: n.ID})
				id = n.ID
				return err == nil && len(devs) == e2eGPUs
			}
		}
		return false
	})
	return id
}

// status is what bcd status --json says of a state directory.
type status struct {
	daemon.Status
	Running bool `json:"running"`
}

// statusOf runs bin's bcd status --json on state.
func statusOf(bin, state string) (status, error) {
	var st status
	out, err := exec.Command(bin, "status", "--json", "--state-dir", state).Output()
	if err == nil {
		err = json.Unmarshal(out, &st)
	}
	return st, err
}

// waitStatus waits for the status file of the node in state to satisfy cond (read as bcd
// status reads it, without running a process each time), and returns what bcd status --json
// says then.
func waitStatus(t *testing.T, bin, state, what string, cond func(status) bool) status {
	t.Helper()
	computetest.Eventually(t, e2eWait, what, func() bool {
		st, running, err := daemon.ReadStatus(state)
		return err == nil && cond(status{st, running})
	})
	st, err := statusOf(bin, state)
	if err != nil || !cond(st) {
		t.Fatalf("bcd status --json does not say %s: %+v, %v", what, st, err)
	}
	return st
}

// writeFakeConfig writes a bcd config of fake hardware, for bcd doctor.
func writeFakeConfig(t *testing.T) string {
	p := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(p, []byte(`{"fake": {"gpus": 8}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
