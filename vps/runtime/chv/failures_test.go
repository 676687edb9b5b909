package chv

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/compute/vps/runtime"
)

// TestFailuresOfANewInstanceLeaveNothing: when a new instance cannot be made (its VMM exits as
// it starts, does not answer, answers an error or garbage, or stops answering mid-way), Ensure
// says what failed, with cloud-hypervisor's own words where it gave some, and leaves nothing of
// the instance: no VMM, directory, tap or console socket.
func TestFailuresOfANewInstanceLeaveNothing(t *testing.T) {
	t.Parallel()
	cases := []struct {
		fail string
		want []string
	}{
		{"start=exit", []string{"exited as it started", "fake cloud-hypervisor: failing at start as the test asked"}},
		{"vmm.ping=hang", []string{"did not answer on", "within 1s, killed"}},
		{"vm.create=400", []string{"PUT vm.create: 400 Bad Request: Injected failure of vm.create: the test asked the fake for 400"}},
		{"vm.boot=500", []string{"PUT vm.boot: 500 Internal Server Error: Injected failure of vm.boot"}},
		{"vm.info=garbage", []string{"GET vm.info: the answer (200, \"<html>this is not JSON</html>\") is not what the API describes"}},
		{"vm.info=hang", []string{"GET vm.info: no answer within 2s (Options.CallTimeout)"}},
	}
	for _, c := range cases {
		t.Run(c.fail, func(t *testing.T) {
			t.Parallel()
			// Short timeouts only where the case waits them out: a loaded machine starts the fake
			// (a re-exec of this test binary) slowly, and answers slowly.
			h := newHarness(t, func(o *Options) {
				switch c.fail {
				case "vmm.ping=hang":
					o.StartTimeout = time.Second
				case "vm.info=hang":
					o.CallTimeout = 2 * time.Second
				}
			})
			h.fakeFails(c.fail)
			in := h.instance("f")
			start := time.Now()
			st, err := h.r.Ensure(context.Background(), in)
			if err == nil {
				t.Fatalf("Ensure = %+v; want an error", st)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("Ensure: %v\nwant it to say %q", err, w)
				}
			}
			if took := time.Since(start); took > 15*time.Second {
				t.Fatalf("Ensure took %v to fail", took)
			}
			h.gone("f", in.Console)
			if list, err := h.r.List(context.Background()); err != nil || len(list) != 0 {
				t.Fatalf("List = %+v, %v; want nothing", list, err)
			}
			// Once the VMM behaves, the instance is made as if nothing had happened.
			h.fakeFails("")
			h.ensure(in, runtime.StateRunning)
			greets(t, in.Console, "f")
		})
	}
}

// TestFailuresOfAnExistingInstanceKeepIt: an instance that exists is not undone by a call that
// fails: it stays as it was, and a later call converges it.
func TestFailuresOfAnExistingInstanceKeepIt(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.fakeFails("vm.pause=500")
	in := h.instance("e")
	h.ensure(in, runtime.StateRunning)
	h.fakeFails("")
	in.Power = runtime.PowerPaused
	if _, err := h.r.Ensure(context.Background(), in); err == nil || !strings.Contains(err.Error(), "PUT vm.pause: 500") {
		t.Fatalf("Ensure paused with a VMM that fails vm.pause: %v", err)
	}
	list, err := h.r.List(context.Background())
	if err != nil || len(list) != 1 || list[0].State != runtime.StateRunning {
		t.Fatalf("List = %+v, %v; want e still running", list, err)
	}
	greets(t, in.Console, "e")
	if _, err := os.Stat(h.r.files("e").record); err != nil {
		t.Fatalf("the record of an instance that exists: %v", err)
	}
}
