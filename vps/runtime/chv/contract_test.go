package chv

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/better-compute/compute/vps/runtime"
)

// TestTheRuntimeCallsOnlyDescribedOperations reads the runtime's source for the operations it
// names and checks each against the vendored OpenAPI description, with the method it uses.
func TestTheRuntimeCallsOnlyDescribedOperations(t *testing.T) {
	t.Parallel()
	spec, err := loadSpec(specPath)
	if err != nil {
		t.Fatal(err)
	}
	sources, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	opRE := regexp.MustCompile(`"(vmm?\.[a-z-]+)"`)
	found := map[string]bool{}
	for _, f := range sources {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range opRE.FindAllStringSubmatch(string(src), -1) {
			found[m[1]] = true
		}
	}
	// The methods the client uses: GET for what reads, PUT for the rest (client.go).
	gets := map[string]bool{"vm.info": true, "vmm.ping": true}
	var ops []string
	for op := range found {
		ops = append(ops, op)
		method := http.MethodPut
		if gets[op] {
			method = http.MethodGet
		}
		if _, _, ok := spec.bodySchema(method, "/"+op); !ok {
			t.Errorf("the runtime calls %s %s, which the description does not have", method, op)
		}
	}
	slices.Sort(ops)
	want := []string{"vm.boot", "vm.create", "vm.delete", "vm.info", "vm.pause", "vm.reboot", "vm.restore",
		"vm.resume", "vm.shutdown", "vm.snapshot", "vmm.ping", "vmm.shutdown"}
	if !slices.Equal(ops, want) {
		t.Fatalf("the runtime names the operations %v; the test knows %v: update it", ops, want)
	}
}

// TestTheRuntimesBodiesMatchTheirSchemas: every body the runtime sends, with every field it can
// set, is valid against its schema.
func TestTheRuntimesBodiesMatchTheirSchemas(t *testing.T) {
	t.Parallel()
	spec, err := loadSpec(specPath)
	if err != nil {
		t.Fatal(err)
	}
	full := vmConfig{
		CPUs:    cpusConfig{BootVCPUs: 4, MaxVCPUs: 4},
		Memory:  memoryConfig{Size: 64 << 30},
		Payload: payloadConfig{Kernel: "/k", Cmdline: "console=ttyS0", Initramfs: "/i"},
		Disks:   []diskConfig{{Path: "/d", ImageType: "Qcow2", BackingFiles: true, ID: "disk0"}},
		Net:     []netConfig{{Tap: "bc0123456789a0", MAC: "52:54:00:00:00:01", ID: "net0"}},
		Serial:  consoleConfig{Mode: "Socket", Socket: "/s.sock"},
		Console: consoleConfig{Mode: "Off"},
		Devices: []deviceConfig{{Path: "/sys/bus/pci/devices/0000:3b:00.0", ID: "gpu0"}},
	}
	firmware := vmConfig{CPUs: full.CPUs, Memory: full.Memory, Payload: payloadConfig{Firmware: "/fw"},
		Serial: consoleConfig{Mode: "File", File: "/serial.log"}, Console: consoleConfig{Mode: "Off"}}
	for _, c := range []struct {
		schema string
		body   any
	}{
		{"VmConfig", full},
		{"VmConfig", firmware},
		{"VmSnapshotConfig", snapshotConfig{DestinationURL: "file:///saves/a.partial"}},
		{"RestoreConfig", restoreConfig{SourceURL: "file:///saves/a"}},
	} {
		data, err := json.Marshal(c.body)
		if err != nil {
			t.Fatal(err)
		}
		if errs := spec.validateJSON(c.schema, data); len(errs) > 0 {
			t.Errorf("%s %s: %v", c.schema, data, errs)
		}
	}
}

// TestTheValidatorIsStrict: the fake's validator catches what a real cloud-hypervisor would
// silently ignore (a misspelt field) or refuse (a wrong type, a missing field, a value out of
// its enum or range).
func TestTheValidatorIsStrict(t *testing.T) {
	t.Parallel()
	spec, err := loadSpec(specPath)
	if err != nil {
		t.Fatal(err)
	}
	errs := spec.validateJSON("VmConfig", []byte(`{"payload":{"kernel":"/k"},"cpus":{"boot_vcpu":2,"max_vcpus":"2"},`+
		`"serial":{"mode":"Sockets"},"disks":[{"path":"/d","pci_segment":70000}]}`))
	for _, want := range []string{
		`$.cpus: required property "boot_vcpus" is missing`,
		`$.cpus: property "boot_vcpu" is not in the schema`,
		`$.cpus.max_vcpus: want a number, have string`,
		`$.serial.mode: Sockets is not one of`,
		`$.disks[0].pci_segment: 70000 is out of int16`,
	} {
		if !slices.ContainsFunc(errs, func(e string) bool { return strings.HasPrefix(e, want) }) {
			t.Errorf("the validator did not say %q; it said %q", want, errs)
		}
	}
	if errs := spec.validateJSON("VmConfig", []byte(`{"payload":{}} {}`)); len(errs) == 0 {
		t.Error("two documents passed as one")
	}
}

// TestTheFakeRefusesAndRecordsViolations: a request that breaks the contract is answered 400
// (or 404 for an unknown operation) and recorded, so that the harness fails the test that sent
// it; the fake's own answers are valid against the description.
func TestTheFakeRefusesAndRecordsViolations(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.allowViolations = true
	ctx := context.Background()
	in := h.instance("a")
	h.ensure(in, runtime.StateRunning)
	c := h.r.client(h.r.files("a"))

	var ae *APIError
	err := c.call(ctx, http.MethodPut, "vm.resize", map[string]any{"desired_vcpu": 2}, nil)
	if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest {
		t.Fatalf("a misspelt vm.resize: %v; want 400", err)
	}
	if err := c.call(ctx, http.MethodPut, "vm.fly", nil, nil); !errors.As(err, &ae) || ae.Status != http.StatusNotFound {
		t.Fatalf("an unknown operation: %v; want 404", err)
	}
	if err := c.call(ctx, http.MethodGet, "vm.boot", nil, nil); !errors.As(err, &ae) || ae.Status != http.StatusBadRequest {
		t.Fatalf("GET vm.boot: %v; want 400", err)
	}
	var violations []string
	for _, r := range fakeLog(t, h.stateDir, "bc-a") {
		if r.Violation != "" {
			violations = append(violations, r.Op+": "+r.Violation)
		}
	}
	want := []string{`vm.resize: VmResize: $: property "desired_vcpu" is not in the schema`,
		"vm.fly: /vm.fly is not in the description", "vm.boot: GET /vm.boot is not in the description"}
	if !slices.Equal(violations, want) {
		t.Fatalf("violations recorded: %q; want %q", violations, want)
	}

	spec, _ := loadSpec(specPath)
	for op, schema := range map[string]string{"vmm.ping": "VmmPingResponse", "vm.info": "VmInfo"} {
		var raw json.RawMessage
		if err := c.call(ctx, http.MethodGet, op, nil, &raw); err != nil {
			t.Fatal(err)
		}
		if errs := spec.validateJSON(schema, raw); len(errs) > 0 {
			t.Errorf("the fake's %s answer is not a %s: %v", op, schema, errs)
		}
	}
}
