package chv

// The fake cloud-hypervisor: this test binary, re-executed by the runtime as its Binary with
// BC_CHV_FAKE set to the OpenAPI description's path. It serves the API on --api-socket as
// cloud-hypervisor does (vmm/src/api/http, vmm/src/lib.rs at the vendored commit):
//
//   - every request must be an operation of the description, with a body valid against its
//     schema (strictly: no unknown properties); otherwise it answers 400 (404 for an unknown
//     path) and records a violation, which fails the test;
//   - the VM's state machine: none → vm.create → Created → vm.boot → Running ⇄ Paused;
//     vm.shutdown drops the VM and keeps its config, so vm.info says Created again, as
//     cloud-hypervisor's does; vm.snapshot only when Paused; vm.restore only without a VM, and
//     leaves it Paused; vm.delete drops the config; vmm.shutdown exits;
//   - errors as cloud-hypervisor answers them: 404 when no VM is created, 500 for a state that
//     forbids the call, 400 for a body it cannot read, with the error chain as a JSON array of
//     strings;
//   - a serial console in Socket mode behaves as cloud-hypervisor's (vmm/src/console_devices.rs,
//     serial_manager.rs): vm.create (and vm.boot or vm.restore when none is bound) binds the
//     socket; a booted VM serves it (greeting whoever connects); shutting the VM down removes the
//     socket file; a socket bound for a VM that never booted stays, file included, through
//     vm.delete and even the VMM's exit, so binding it again fails until someone removes it;
//   - a guest that powers off (SIGUSR1 to the fake) ends the VMM, or with --no-shutdown shuts
//     the VM down and leaves it Created, as cloud-hypervisor's event loop does;
//   - vm.boot opens what the VM needs as cloud-hypervisor's does: its disks (a qcow2 image with a
//     backing file only with backing_files), its VFIO devices' sysfs paths, and, with
//     fake-taps, its tap devices in the VMM's network namespace.
//
// It appends every request to StateDir/fake-<vm>.jsonl (the directory above its socket's) for
// the tests to read. What a test asks of the fakes its runtime starts is in files of StateDir
// (harness.fakeFails, harness.fakeTaps), so that tests running side by side ask each its own:
// fake-fail injects failures, "start=exit" (exit at start), "<op>=<status>" (answer op with that
// status), "vm.info=garbage" (a body that is not JSON), "vmm.ping=hang" (never answer a ping),
// comma-separated; fake-taps has the fake check its taps.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

const (
	fakeEnv = "BC_CHV_FAKE"
	// fakeFailFile and fakeTapsFile, in StateDir, say what the fakes started there do.
	fakeFailFile = "fake-fail"
	fakeTapsFile = "fake-taps"
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(fakeEnv); spec != "" {
		os.Exit(fakeMain(spec, os.Args[1:]))
	}
	// Every VMM the tests start is this binary in fake mode.
	if err := os.Setenv(fakeEnv, specFile()); err != nil {
		panic(err)
	}
	goleak.VerifyTestMain(m)
}

// fakeRequest is one line of the request log.
type fakeRequest struct {
	Start     []string        `json:"start,omitempty"` // the arguments, on the first line
	PID       int             `json:"pid,omitempty"`
	Event     string          `json:"event,omitempty"` // what happened without a request: "poweroff"
	Method    string          `json:"method,omitempty"`
	Op        string          `json:"op,omitempty"`
	Body      json.RawMessage `json:"body,omitempty"`
	Status    int             `json:"status,omitempty"`
	Answer    json.RawMessage `json:"answer,omitempty"` // an error's chain
	Violation string          `json:"violation,omitempty"`
}

type fakeVMM struct {
	spec       *apiSpec
	name       string            // bc-<id>
	fail       map[string]string // op → what to do
	checkTaps  bool
	noShutdown bool
	logMu      sync.Mutex
	log        string
	exitCh     chan struct{}

	mu     sync.Mutex
	config json.RawMessage // nil: no VM created
	booted bool
	paused bool
	// consoleInfo is the serial socket bound for the VM (cloud-hypervisor's console_info):
	// closing it does not remove its file, as dropping a Rust UnixListener does not.
	consoleInfo *net.UnixListener
	// serial is the booted VM's serial manager's socket: it is served, and shutting the VM down
	// removes its file.
	serial  *net.UnixListener
	exiting bool
}

func fakeMain(specPath string, args []string) int {
	var socket string
	noShutdown := false
	for i, a := range args {
		if a == "--api-socket" && i+1 < len(args) {
			socket = args[i+1]
		}
		noShutdown = noShutdown || a == "--no-shutdown"
	}
	if socket == "" {
		fmt.Fprintln(os.Stderr, "fake cloud-hypervisor: no --api-socket")
		return 2
	}
	stateDir := filepath.Dir(filepath.Dir(socket))
	fail := map[string]string{}
	asked, _ := os.ReadFile(filepath.Join(stateDir, fakeFailFile))
	for _, kv := range strings.Split(strings.TrimSpace(string(asked)), ",") {
		if op, what, ok := strings.Cut(kv, "="); ok {
			fail[op] = what
		}
	}
	if fail["start"] == "exit" {
		fmt.Fprintln(os.Stderr, "fake cloud-hypervisor: failing at start as the test asked")
		return 1
	}
	_, err := os.Stat(filepath.Join(stateDir, fakeTapsFile))
	checkTaps := err == nil
	spec, err := loadSpec(specPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake cloud-hypervisor:", err)
		return 2
	}
	vmDir := filepath.Dir(socket)
	f := &fakeVMM{
		spec: spec, name: filepath.Base(vmDir), fail: fail, exitCh: make(chan struct{}),
		checkTaps: checkTaps, noShutdown: noShutdown,
		log: filepath.Join(filepath.Dir(vmDir), "fake-"+filepath.Base(vmDir)+".jsonl"),
	}
	f.record(fakeRequest{Start: args, PID: os.Getpid()})
	_ = os.Remove(socket) // as cloud-hypervisor does before it binds its API socket
	ln, err := net.Listen("unix", socket)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake cloud-hypervisor:", err)
		return 1
	}
	srv := &http.Server{Handler: f}
	go func() { _ = srv.Serve(ln) }()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGUSR1)
	for done := false; !done; {
		select {
		case <-f.exitCh:
			done = true
		case s := <-sigs:
			if s == syscall.SIGUSR1 && f.guestPowerOff() {
				continue
			}
			done = true
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = srv.Shutdown(ctx) // closes the listener, which removes the socket
	f.mu.Lock()
	f.deleteVM()
	f.mu.Unlock()
	return 0
}

// guestPowerOff is the guest powering off: with --no-shutdown the VM shuts down and the VMM
// stays (it reports true); without, the VMM exits.
func (f *fakeVMM) guestPowerOff() bool {
	f.record(fakeRequest{Event: "poweroff"})
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.noShutdown && f.booted {
		f.shutdownVM()
		return true
	}
	return false
}

func (f *fakeVMM) record(r fakeRequest) {
	f.logMu.Lock()
	defer f.logMu.Unlock()
	data, _ := json.Marshal(r)
	lf, err := os.OpenFile(f.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake cloud-hypervisor: request log:", err)
		return
	}
	defer lf.Close()
	_, _ = lf.Write(append(data, '\n'))
}

// answer writes an answer: status, and msgs as cloud-hypervisor's error chain when it fails.
func answer(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if body != nil {
		_ = json.NewEncoder(w).Encode(body)
	}
}

func (f *fakeVMM) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	op := strings.TrimPrefix(req.URL.Path, "/api/v1/")
	rec := fakeRequest{Method: req.Method, Op: op}
	if len(body) > 0 {
		if json.Valid(body) {
			rec.Body = body
		} else {
			rec.Body, _ = json.Marshal(string(body))
		}
	}
	status, out := f.serve(req.Context(), req.Method, op, body, &rec)
	rec.Status = status
	if msgs, ok := out.([]string); ok {
		rec.Answer, _ = json.Marshal(msgs)
	}
	f.record(rec)
	if s, ok := out.(string); ok { // a raw, broken answer
		w.WriteHeader(status)
		_, _ = io.WriteString(w, s)
		return
	}
	answer(w, status, out)
	if op == "vmm.shutdown" && status == http.StatusNoContent {
		if fl, ok := w.(http.Flusher); ok {
			fl.Flush()
		}
		f.mu.Lock()
		if !f.exiting {
			f.exiting = true
			close(f.exitCh)
		}
		f.mu.Unlock()
	}
}

// serve checks a request against the description and runs it; it returns the status and the
// answer (an error chain, a JSON value, or a string sent as it is).
func (f *fakeVMM) serve(ctx context.Context, method, op string, body []byte, rec *fakeRequest) (int, any) {
	schema, required, ok := f.spec.bodySchema(method, "/"+op)
	if !ok {
		if _, known := f.spec.Paths["/"+op]; known {
			rec.Violation = method + " /" + op + " is not in the description"
			return http.StatusBadRequest, nil
		}
		rec.Violation = "/" + op + " is not in the description"
		return http.StatusNotFound, []string{"Not Found"}
	}
	switch {
	case schema != "" && len(body) == 0 && required:
		rec.Violation = "no body; the description requires a " + schema
		return http.StatusBadRequest, []string{"Missing request body"}
	case schema != "":
		if errs := f.spec.validateJSON(schema, body); len(errs) > 0 {
			rec.Violation = schema + ": " + strings.Join(errs, "; ")
			return http.StatusBadRequest, append([]string{"Error deserialising JSON"}, errs...)
		}
	case len(body) > 0:
		rec.Violation = "a body for an operation that takes none"
	}
	switch what := f.fail[op]; {
	case what == "garbage":
		return http.StatusOK, "<html>this is not JSON</html>"
	case what == "hang":
		<-ctx.Done()
		return http.StatusServiceUnavailable, nil
	case what != "":
		code, _ := strconv.Atoi(what)
		return code, []string{"Injected failure of " + op, "the test asked the fake for " + what}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.op(op, body)
}

// state is the VM's state as vm.info reports it.
func (f *fakeVMM) state() string {
	switch {
	case f.booted && f.paused:
		return vmPaused
	case f.booted:
		return vmRunning
	}
	return vmCreated
}

// op runs one operation on the state machine; f.mu is held.
func (f *fakeVMM) op(op string, body []byte) (int, any) {
	notCreated := func(top string) (int, any) { return http.StatusNotFound, []string{top, "VM is not created"} }
	notRunning := func(top string) (int, any) { return http.StatusInternalServerError, []string{top, "VM is not running"} }
	transition := func(top, what, to string) (int, any) {
		return http.StatusInternalServerError, []string{top, what, fmt.Sprintf("invalid VM state transition: %s to %s", f.state(), to)}
	}
	switch op {
	case "vmm.ping":
		return http.StatusOK, map[string]any{"version": "v0.0.0-fake", "build_version": "fake", "pid": os.Getpid(), "features": []string{}}
	case "vmm.shutdown":
		f.deleteVM()
		return http.StatusNoContent, nil
	case "vm.info":
		if f.config == nil {
			return notCreated("The VM info is not available")
		}
		return http.StatusOK, map[string]any{"config": f.config, "state": f.state()}
	case "vm.create":
		const top = "The VM could not be created"
		if f.config != nil {
			return http.StatusInternalServerError, []string{top, "VM is already created"}
		}
		var cfg vmConfig
		_ = json.Unmarshal(body, &cfg)
		if cfg.Payload.Kernel == "" && cfg.Payload.Firmware == "" {
			return http.StatusBadRequest, []string{top, "Error validating configuration", "No kernel or firmware specified"}
		}
		// cloud-hypervisor keeps the config before it binds the consoles, and keeps it when
		// that fails.
		f.config = body
		if err := f.preCreateConsole(body); err != nil {
			return http.StatusInternalServerError, []string{top, "Error creating console devices", err.Error()}
		}
		return http.StatusNoContent, nil
	case "vm.boot":
		const top = "The VM could not boot"
		if f.config == nil {
			return notCreated(top)
		}
		if f.booted {
			return http.StatusInternalServerError, []string{top, "VM is already created"}
		}
		if f.consoleInfo == nil {
			if err := f.preCreateConsole(f.config); err != nil {
				return http.StatusInternalServerError, []string{top, "Error creating console devices", err.Error()}
			}
		}
		if err := f.openDevices(f.config); err != nil {
			return http.StatusInternalServerError, []string{top, "Error creating the device manager", err.Error()}
		}
		f.startVM(false)
		return http.StatusNoContent, nil
	case "vm.pause", "vm.resume":
		top := map[string]string{"vm.pause": "The VM could not be paused", "vm.resume": "The VM could not resume"}[op]
		if !f.booted {
			return notRunning(top)
		}
		if f.paused == (op == "vm.pause") {
			to := map[string]string{"vm.pause": vmPaused, "vm.resume": vmRunning}[op]
			return transition(top, "Error "+strings.TrimPrefix(op, "vm.")+"ing VM", to)
		}
		f.paused = op == "vm.pause"
		return http.StatusNoContent, nil
	case "vm.shutdown":
		if !f.booted {
			return notRunning("The VM could not shutdown")
		}
		f.shutdownVM()
		return http.StatusNoContent, nil
	case "vm.reboot":
		const top = "The VM could not reboot"
		if !f.booted {
			return notCreated(top)
		}
		f.shutdownVM()
		if err := f.preCreateConsole(f.config); err != nil {
			return http.StatusInternalServerError, []string{top, "Error creating console devices", err.Error()}
		}
		f.startVM(false)
		return http.StatusNoContent, nil
	case "vm.delete":
		f.deleteVM()
		return http.StatusNoContent, nil
	case "vm.snapshot":
		return f.snapshot(body)
	case "vm.restore":
		return f.restore(body)
	}
	return http.StatusInternalServerError, []string{"the fake does not implement " + op}
}

// preCreateConsole binds the serial socket of cfg when it is in Socket mode, as
// cloud-hypervisor's pre_create_console_devices does (replacing the one it kept).
func (f *fakeVMM) preCreateConsole(cfg []byte) error {
	var c vmConfig
	if err := json.Unmarshal(cfg, &c); err != nil {
		return err
	}
	f.dropConsoleInfo()
	if c.Serial.Mode != "Socket" {
		return nil
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: c.Serial.Socket, Net: "unix"})
	if err != nil {
		return err
	}
	ln.SetUnlinkOnClose(false)
	f.consoleInfo = ln
	return nil
}

// dropConsoleInfo forgets the bound console socket; its file stays. A socket the running VM
// serves stays open.
func (f *fakeVMM) dropConsoleInfo() {
	if f.consoleInfo != nil && f.consoleInfo != f.serial {
		_ = f.consoleInfo.Close()
	}
	f.consoleInfo = nil
}

// startVM boots (or restores) the VM: its serial manager serves the bound socket.
func (f *fakeVMM) startVM(paused bool) {
	f.booted, f.paused = true, paused
	f.serial = f.consoleInfo
	if f.serial == nil {
		return
	}
	go func(ln *net.UnixListener) { // ends when shutdownVM closes the listener
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = fmt.Fprintf(conn, "fake serial console of %s\r\n", f.name)
			_ = conn.Close()
		}
	}(f.serial)
}

// shutdownVM shuts the booted VM down: the serial manager goes and removes its socket's file;
// the config stays (vm.info: Created).
func (f *fakeVMM) shutdownVM() {
	if !f.booted {
		return
	}
	f.dropConsoleInfo()
	if f.serial != nil {
		path := f.serial.Addr().String()
		_ = f.serial.Close()
		_ = os.Remove(path)
		f.serial = nil
	}
	f.booted, f.paused = false, false
}

// deleteVM is vm.delete: a booted VM is shut down, and the config goes. A socket bound for a VM
// that never booted stays bound.
func (f *fakeVMM) deleteVM() {
	f.shutdownVM()
	f.config = nil
}

// openDevices checks what cloud-hypervisor opens when it boots a VM.
func (f *fakeVMM) openDevices(cfg []byte) error {
	var c vmConfig
	if err := json.Unmarshal(cfg, &c); err != nil {
		return err
	}
	for _, p := range []string{c.Payload.Kernel, c.Payload.Initramfs, c.Payload.Firmware} {
		if _, err := os.Stat(p); p != "" && err != nil {
			return fmt.Errorf("Cannot load the payload: %w", err)
		}
	}
	for _, d := range c.Disks {
		if err := openDisk(d); err != nil {
			return fmt.Errorf("Error opening disk %s: %w", d.Path, err)
		}
	}
	for _, d := range c.Devices {
		if _, err := os.Stat(d.Path); err != nil {
			return fmt.Errorf("Failed to create VFIO device %s: %w", d.Path, err)
		}
	}
	if f.checkTaps {
		for _, n := range c.Net {
			ifc, err := net.InterfaceByName(n.Tap)
			if err != nil {
				return fmt.Errorf("Open tap device failed: %s: %w", n.Tap, err)
			}
			if ifc.Flags&net.FlagUp == 0 {
				return fmt.Errorf("tap %s is down", n.Tap)
			}
		}
	}
	return nil
}

// openDisk opens a disk as cloud-hypervisor's block factory does: a qcow2 image with a backing
// file needs backing_files.
func openDisk(d diskConfig) error {
	fh, err := os.Open(d.Path)
	if err != nil {
		return err
	}
	defer fh.Close()
	hdr := make([]byte, 16)
	_, _ = io.ReadFull(fh, hdr)
	isQcow := string(hdr[:4]) == "QFI\xfb"
	switch d.ImageType {
	case "Qcow2":
		if !isQcow {
			return errors.New("not a qcow2 image")
		}
		if hdr[8]|hdr[9]|hdr[10]|hdr[11]|hdr[12]|hdr[13]|hdr[14]|hdr[15] != 0 && !d.BackingFiles {
			return errors.New("the image has a backing file and backing_files is off")
		}
	case "Raw", "":
	default:
		return fmt.Errorf("the fake opens no %s image", d.ImageType)
	}
	return nil
}

func urlDir(url string) (string, error) {
	dir, ok := strings.CutPrefix(url, "file://")
	if !ok {
		return "", fmt.Errorf("Could not extract path from URL: %s", url)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("Destination is not a directory: %q", dir)
	}
	return dir, nil
}

func (f *fakeVMM) snapshot(body []byte) (int, any) {
	const top = "The VM could not be snapshotted"
	if !f.booted {
		return http.StatusInternalServerError, []string{top, "VM is not running"}
	}
	// cloud-hypervisor drains console_info before it snapshots: the VM keeps serving it.
	f.dropConsoleInfo()
	if !f.paused {
		return http.StatusInternalServerError, []string{top, "Error snapshotting VM", "Trying to snapshot while VM is running"}
	}
	var sc snapshotConfig
	_ = json.Unmarshal(body, &sc)
	dir, err := urlDir(sc.DestinationURL)
	if err != nil {
		return http.StatusInternalServerError, []string{top, "Error sending snapshot", err.Error()}
	}
	state, _ := json.Marshal(map[string]string{"fake": "state of " + f.name})
	for name, data := range map[string][]byte{"config.json": f.config, "state.json": state, "memory-ranges": []byte("fake memory")} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return http.StatusInternalServerError, []string{top, "Error sending snapshot", err.Error()}
		}
	}
	return http.StatusNoContent, nil
}

func (f *fakeVMM) restore(body []byte) (int, any) {
	const top = "The VM could not be restored"
	if f.config != nil || f.booted {
		return http.StatusInternalServerError, []string{top, "VM is already created"}
	}
	var rc struct {
		SourceURL string `json:"source_url"`
		Resume    bool   `json:"resume"`
	}
	_ = json.Unmarshal(body, &rc)
	dir, err := urlDir(rc.SourceURL)
	if err != nil {
		return http.StatusInternalServerError, []string{top, "Error restoring VM", err.Error()}
	}
	cfg, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err == nil {
		_, err = os.Stat(filepath.Join(dir, "state.json"))
	}
	if err != nil {
		return http.StatusInternalServerError, []string{top, "Error restoring VM", err.Error()}
	}
	if errs := f.spec.validateJSON("VmConfig", cfg); len(errs) > 0 {
		return http.StatusInternalServerError, []string{top, "Error deserialising VM config snapshot", strings.Join(errs, "; ")}
	}
	// A restore that fails deletes the VM (vm_restore's map_err calls vm_delete).
	f.config = cfg
	if err := f.preCreateConsole(cfg); err != nil {
		f.deleteVM()
		return http.StatusInternalServerError, []string{top, "Error creating console devices", err.Error()}
	}
	if err := f.openDevices(cfg); err != nil {
		f.deleteVM()
		return http.StatusInternalServerError, []string{top, "Error restoring VM", err.Error()}
	}
	f.startVM(!rc.Resume)
	return http.StatusNoContent, nil
}

// fakeLog reads the request log of the VM named name under stateDir.
func fakeLog(t testing.TB, stateDir, name string) []fakeRequest {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(stateDir, "fake-"+name+".jsonl"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []fakeRequest
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var r fakeRequest
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("request log line %q: %v", line, err)
		}
		out = append(out, r)
	}
	return out
}
