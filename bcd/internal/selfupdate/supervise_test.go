package selfupdate

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/compute/computetest"
)

// The supervisor is tested with real processes: shell scripts stand in for bcd binaries. The
// one in slot a (the working bcd) waits for a signal file and then re-execs itself into the
// current slot, in the same process, as bcd node does after installing an update.
const oldBinary = `#!/bin/sh
echo "a $$" >> "$LOG"
while [ ! -e "$GO" ]; do sleep 0.05; done
rm -f "$GO"
exec "$SLOTS/current/bcd"
`

var newBinaries = map[string]string{
	"exits":   "#!/bin/sh\necho \"b $$\" >> \"$LOG\"\nexit 3\n",
	"hangs":   "#!/bin/sh\necho \"b $$\" >> \"$LOG\"\nexec sleep 1000\n",
	"commits": "#!/bin/sh\necho \"b $$\" >> \"$LOG\"\nrm -f \"$SLOTS/trial.json\"\nexec sleep 1000\n",
}

func TestSupervisor(t *testing.T) {
	// Not parallel: the stand-in binaries read their files from the environment, which the
	// supervisor's child inherits from this process.
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Skip("needs /bin/sh")
	}
	for _, tc := range []struct {
		binary     string
		rolledBack bool
		reason     string
	}{
		{"exits", true, "exited during its trial (exit status 3)"},
		{"hangs", true, "did not reach its gateway within 3s"},
		{"commits", false, ""},
	} {
		t.Run(tc.binary, func(t *testing.T) {
			dir := t.TempDir()
			s := Slots{Dir: filepath.Join(dir, "slots")}
			log, goFile := filepath.Join(dir, "log"), filepath.Join(dir, "go")
			t.Setenv("LOG", log)
			t.Setenv("GO", goFile)
			t.Setenv("SLOTS", s.Dir)
			self := filepath.Join(dir, "bcd")
			writeFile(t, self, oldBinary)
			sv := &Supervisor{Slots: s, Self: self, Grace: 300 * time.Millisecond, Backoff: 100 * time.Millisecond,
				Stdout: io.Discard, Stderr: io.Discard, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- sv.Run(ctx) }()
			defer func() {
				cancel()
				select {
				case <-done:
				case <-time.After(20 * time.Second):
					t.Error("the supervisor did not stop")
				}
			}()
			lines := func() []string {
				b, _ := os.ReadFile(log)
				return strings.Fields(string(b))
			}
			computetest.Eventually(t, 30*time.Second, "the old binary running", func() bool { return len(lines()) == 2 })
			pid := lines()[1]

			// The old binary installs the new one, switches, and re-execs into it.
			if err := s.Write(SlotB, strings.NewReader(newBinaries[tc.binary])); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(3 * time.Second)
			if err := s.Begin(Trial{Slot: SlotB, Previous: SlotA, Version: "v2", PreviousVersion: "v1", Try: "v2/r#1",
				Started: time.Now(), Deadline: deadline}); err != nil {
				t.Fatal(err)
			}
			writeFile(t, goFile, "")
			computetest.Eventually(t, 30*time.Second, "the new binary running", func() bool { return len(lines()) >= 4 })
			if l := lines(); l[2] != "b" || l[3] != pid {
				t.Fatalf("the new binary did not run in the old one's process: %v", l)
			}
			if !tc.rolledBack {
				computetest.Eventually(t, 30*time.Second, "the new binary committing its trial", func() bool {
					tr, err := s.Trial()
					return err == nil && tr == nil
				})
				// The deadline and the grace pass on the supervisor's clock, with a round of its
				// (250 ms) look at the trial after them: the passing of time is what is under test.
				<-time.After(time.Until(deadline.Add(sv.Grace + 500*time.Millisecond)))
				if cur, _, _ := s.Current(); cur != SlotB || len(lines()) != 4 {
					t.Fatalf("a committed update: current %s, runs %v", cur, lines())
				}
				if rb, _ := s.LastRollback(); rb != nil {
					t.Fatalf("a committed update was rolled back: %+v", rb)
				}
				return
			}
			computetest.Eventually(t, 30*time.Second, "the old binary running again", func() bool { return len(lines()) == 6 && lines()[4] == "a" })
			if cur, _, _ := s.Current(); cur != SlotA {
				t.Fatalf("current after the rollback = %s", cur)
			}
			rb, _ := s.LastRollback()
			if rb == nil || rb.Version != "v2" || !strings.Contains(rb.Reason, tc.reason) {
				t.Fatalf("the rollback = %+v, want the reason %q", rb, tc.reason)
			}
		})
	}
}
