package site

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/better-compute/compute/metal/siteapi"
)

func facts(macs ...string) siteapi.Facts {
	return siteapi.Facts{Serial: "SN-1", MACs: macs, Vendor: "Supermicro", CPUs: 64, MemoryGiB: 512,
		Disks: []string{"nvme0n1 3.8T"}, GPUs: []string{"10de:2330 0000:17:00.0"}}
}

// TestHello: a ramdisk's hello, with its boot's token, is answered with the machine of the MAC
// it booted with, and its facts reach the Upstream as KindMachineSeen; an unknown machine is
// answered with none and reported without a machine; facts that do not list the boot's MAC, or
// name another machine, are refused.
func TestHello(t *testing.T) {
	t.Parallel()
	ts := startSite(t, fixture(t, t.TempDir(), newRecorder()))
	hello := toJSON(t, siteapi.Hello{Facts: facts(macUnknown, macSecond)})

	// Before the first plan the site boots nobody: no token to say hello with.
	if token := ts.bootToken(t, macSecond); token != "" {
		t.Fatalf("a boot token before any plan: %q", token)
	}
	must(t, ts.SetPlan(testPlan(siteapi.UnknownInspect)))
	second, unknown := ts.bootToken(t, macSecond), ts.bootToken(t, macUnknown)
	status, body, _ := ts.do(t, "POST", siteapi.PathHello, second, hello)
	var ans siteapi.HelloAnswer
	if status != http.StatusOK || json.Unmarshal([]byte(body), &ans) != nil {
		t.Fatalf("hello: %d %s", status, body)
	}
	if diff := cmp.Diff(siteapi.HelloAnswer{Machine: "m-ramdisk"}, ans); diff != "" {
		t.Errorf("answer (-want +got):\n%s", diff)
	}
	status, body, _ = ts.do(t, "POST", siteapi.PathHello, unknown, toJSON(t, siteapi.Hello{Facts: facts(macUnknown)}))
	if status != http.StatusOK || strings.TrimSpace(body) != "{}" {
		t.Errorf("hello of an unknown machine: %d %s, want 200 {}", status, body)
	}
	for _, c := range []struct {
		name, token string
		facts       siteapi.Facts
		status      int
		says        string
	}{
		{"without the boot's MAC", unknown, facts(macIdle), 400, "does not list " + macUnknown},
		{"naming another machine", unknown, facts(macUnknown, macIdle), 409, "name machine m-idle"},
		{"naming two machines", second, facts(macSecond, macDisk), 409, "name two machines"},
	} {
		if status, body, _ := ts.do(t, "POST", siteapi.PathHello, c.token, toJSON(t, siteapi.Hello{Facts: c.facts})); status != c.status || !strings.Contains(body, c.says) {
			t.Errorf("hello %s: %d %s, want %d saying %q", c.name, status, body, c.status, c.says)
		}
	}

	got := ts.up.waitFor(t, "two machines seen", func(s []sent) bool { return len(s) == 2 })
	want := []siteapi.MachineSeen{
		{Machine: "m-ramdisk", Facts: facts(macUnknown, macSecond)},
		{Facts: facts(macUnknown)},
	}
	if diff := cmp.Diff(want, ofKind[siteapi.MachineSeen](got, siteapi.KindMachineSeen)); diff != "" {
		t.Errorf("reports (-want +got):\n%s", diff)
	}
}

// TestBadBodies: every malformed body is a 4xx naming what is wrong (the field where there is
// one), never a 500, and nothing is reported.
func TestBadBodies(t *testing.T) {
	t.Parallel()
	ts := startSite(t, fixture(t, t.TempDir(), newRecorder()))
	must(t, ts.SetPlan(testPlan(siteapi.UnknownInspect)))
	tok, idle := ts.bootToken(t, macRamdisk), ts.bootToken(t, macIdle)
	good := `{"machine":"m-ramdisk","task":"task-1","phase":"wipe"}`
	cases := []struct {
		name, path, token, body string
		status                  int
		says                    string
	}{
		{"hello: no token", siteapi.PathHello, "", `{"facts":{"serial":"S","macs":["` + macRamdisk + `"]}}`, 401, "not the token of a current boot"},
		{"hello: empty", siteapi.PathHello, tok, "", 400, "body: empty"},
		{"hello: not JSON", siteapi.PathHello, tok, "{facts:", 400, "body: not JSON"},
		{"hello: truncated", siteapi.PathHello, tok, `{"facts":{"serial":"x"`, 400, "body: the JSON ends too early"},
		{"hello: an array", siteapi.PathHello, tok, `[1]`, 400, "body: must be a JSON object"},
		{"hello: unknown field", siteapi.PathHello, tok, `{"facts":{"serial":"S","macs":["` + macRamdisk + `"]},"extra":1}`, 400, "extra: unknown field"},
		{"hello: the old token field", siteapi.PathHello, tok, `{"token":"t","facts":{"serial":"S","macs":["` + macRamdisk + `"]}}`, 400, "token: unknown field"},
		{"hello: nested unknown field", siteapi.PathHello, tok, `{"facts":{"serial":"S","macs":["` + macRamdisk + `"],"colour":"red"}}`, 400, "colour: unknown field"},
		{"hello: wrong type", siteapi.PathHello, tok, `{"facts":{"serial":"S","macs":["` + macRamdisk + `"],"cpus":"many"}}`, 400, "facts.cpus: must be a number"},
		{"hello: no serial", siteapi.PathHello, tok, `{"facts":{"macs":["` + macRamdisk + `"]}}`, 400, "facts.serial"},
		{"hello: bad MAC", siteapi.PathHello, tok, `{"facts":{"serial":"S","macs":["52:54:00:00:00:0G"]}}`, 400, "facts.macs"},
		{"hello: control characters", siteapi.PathHello, tok, `{"machine":"a\u0007","facts":{"serial":"S","macs":["` + macRamdisk + `"]}}`, 400, "machine:"},
		{"hello: two values", siteapi.PathHello, tok, `{"facts":{"serial":"S","macs":["` + macRamdisk + `"]}} {}`, 400, "more than one JSON value"},
		{"hello: too large", siteapi.PathHello, tok, `{"facts":{"serial":"` + strings.Repeat("x", helloLimit) + `"}}`, 413, "body: larger than"},
		{"hello: two machines' MACs", siteapi.PathHello, tok, toJSON(t, siteapi.Hello{Facts: facts(macRamdisk, macDisk)}), 409, "facts.macs: name two machines"},
		{"progress: bad phase", siteapi.PathProgress, tok, `{"machine":"m-ramdisk","task":"task-1","phase":"dancing"}`, 400, "phase:"},
		{"progress: bytes over total", siteapi.PathProgress, tok, `{"machine":"m-ramdisk","task":"task-1","phase":"download","bytes":9,"total":5}`, 400, "bytes:"},
		{"progress: no task", siteapi.PathProgress, tok, `{"machine":"m-ramdisk","phase":"wipe"}`, 400, "task:"},
		{"progress: unknown field", siteapi.PathProgress, tok, `{"machine":"m-ramdisk","task":"task-1","phase":"wipe","percent":5}`, 400, "percent: unknown field"},
		{"progress: bytes a string", siteapi.PathProgress, tok, `{"machine":"m-ramdisk","task":"task-1","phase":"wipe","bytes":"5"}`, 400, "bytes: must be a number"},
		{"progress: too large", siteapi.PathProgress, tok, `{"machine":"m-ramdisk","task":"task-1","phase":"failed","error":"` + strings.Repeat("e", progressLimit) + `"}`, 413, "body: larger than"},
		{"progress: no token", siteapi.PathProgress, "", good, 401, "not the token of a current boot"},
		{"progress: a made-up token", siteapi.PathProgress, "tok-ramdisk", good, 401, "not the token of a current boot"},
		{"progress: another machine's boot", siteapi.PathProgress, idle, good, 403, `not machine "m-ramdisk"'s`},
		{"progress: unknown machine", siteapi.PathProgress, tok, `{"machine":"m-gone","task":"task-1","phase":"wipe"}`, 403, `not machine "m-gone"'s`},
		{"task: no machine", siteapi.PathTask, tok, "", 400, "machine: the query parameter is required"},
		{"credential: unknown field", siteapi.PathCredential, tok, `{"machine":"m-ramdisk","task":"task-1","kind":"x"}`, 400, "kind: unknown field"},
		{"credential: another task", siteapi.PathCredential, tok, `{"machine":"m-ramdisk","task":"task-0"}`, 409, `no task "task-0"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			method := "POST"
			if c.path == siteapi.PathTask {
				method = "GET"
			}
			status, body, h := ts.do(t, method, c.path, c.token, c.body)
			var e apiError
			if status != c.status || json.Unmarshal([]byte(body), &e) != nil || !strings.Contains(e.Error.Message, c.says) {
				t.Errorf("%d %s, want %d saying %q", status, body, c.status, c.says)
			}
			if status == 401 && h.Get("WWW-Authenticate") == "" {
				t.Error("401 without WWW-Authenticate")
			}
		})
	}
	if got := ts.up.reports(); len(got) != 0 {
		t.Errorf("bad requests were reported: %+v", got)
	}
}

// TestTask: a machine's task goes only to a boot of the machine, the latest of its MAC; 204
// while it has none; the MAC's next boot ends the one before.
func TestTask(t *testing.T) {
	t.Parallel()
	ts := startSite(t, fixture(t, t.TempDir(), newRecorder()))
	must(t, ts.SetPlan(testPlan(siteapi.UnknownInspect)))
	first, second, idle := ts.bootToken(t, macRamdisk), ts.bootToken(t, macSecond), ts.bootToken(t, macIdle)
	path := siteapi.PathTask + "?machine=m-ramdisk"
	for token, want := range map[string]int{"": 401, idle: 403, first[:len(first)-1]: 401, first + "x": 401} {
		if status, body, _ := ts.do(t, "GET", path, token, ""); status != want {
			t.Errorf("token %q: %d %s, want %d", token, status, body, want)
		}
	}
	for _, token := range []string{first, second} { // a boot of either NIC
		status, body, _ := ts.do(t, "GET", path, token, "")
		var task siteapi.Task
		if status != http.StatusOK || json.Unmarshal([]byte(body), &task) != nil {
			t.Fatalf("task: %d %s", status, body)
		}
		if diff := cmp.Diff(*testPlan("").Machines[0].Task, task); diff != "" {
			t.Errorf("task (-want +got):\n%s", diff)
		}
	}
	if status, body, _ := ts.do(t, "GET", siteapi.PathTask+"?machine=m-idle", idle, ""); status != http.StatusNoContent || body != "" {
		t.Errorf("machine without a task: %d %q, want 204", status, body)
	}

	// The MAC boots again: the first boot is over; the other NIC's is not.
	again := ts.bootToken(t, macRamdisk)
	if status, _, _ := ts.do(t, "GET", path, first, ""); status != http.StatusUnauthorized {
		t.Errorf("the previous boot's token: %d, want 401", status)
	}
	for _, token := range []string{again, second} {
		if status, body, _ := ts.do(t, "GET", path, token, ""); status != http.StatusOK {
			t.Errorf("a current boot's token: %d %s", status, body)
		}
	}
}

// TestJoinCredentialIsHandedOverOnce: a deploy's join credential is not in the task; it goes
// to the first boot of the machine that asks for it (again to that boot), never to another,
// which is told it is gone; a task without one is a 204.
func TestJoinCredentialIsHandedOverOnce(t *testing.T) {
	t.Parallel()
	ts := startSite(t, fixture(t, t.TempDir(), newRecorder()))
	p := testPlan(siteapi.UnknownInspect)
	p.Machines[0].Task = &siteapi.Task{ID: "deploy-1", Kind: siteapi.TaskWipe, Then: siteapi.ThenKexec, Kernel: "http://images.test/k",
		Cmdline: "root=/dev/vda", JoinCredential: "bcdeploy_secret"}
	must(t, ts.SetPlan(p))
	first, second := ts.bootToken(t, macRamdisk), ts.bootToken(t, macSecond)
	if _, body, _ := ts.do(t, "GET", siteapi.PathTask+"?machine=m-ramdisk", first, ""); strings.Contains(body, "bcdeploy_secret") || !strings.Contains(body, "deploy-1") {
		t.Errorf("the task holds the join credential, or is not there: %s", body)
	}
	ask := func(token string) (int, string) {
		status, body, _ := ts.do(t, "POST", siteapi.PathCredential, token, toJSON(t, siteapi.CredentialRequest{Machine: "m-ramdisk", Task: "deploy-1"}))
		return status, body
	}
	for range 2 {
		if status, body := ask(first); status != http.StatusOK || !strings.Contains(body, `"joinCredential":"bcdeploy_secret"`) {
			t.Fatalf("the credential, to the boot that asks first: %d %s", status, body)
		}
	}
	if status, body := ask(second); status != http.StatusGone || strings.Contains(body, "bcdeploy_secret") {
		t.Errorf("the credential, to another boot of the machine: %d %s, want 410", status, body)
	}
	// A restart of the site remembers who had it (TestBootsOutliveARestart); a plan without the
	// task forgets it, and the next task's credential is handed over anew.
	p.Machines[0].Task = &siteapi.Task{ID: "deploy-2", Kind: siteapi.TaskWipe, Then: siteapi.ThenReboot}
	must(t, ts.SetPlan(p))
	if status, body, _ := ts.do(t, "POST", siteapi.PathCredential, second, toJSON(t, siteapi.CredentialRequest{Machine: "m-ramdisk", Task: "deploy-2"})); status != http.StatusNoContent {
		t.Errorf("a task without a credential: %d %s, want 204", status, body)
	}
	if len(ts.boots.claims) != 0 {
		t.Errorf("claims of tasks gone from the plan are kept: %v", ts.boots.claims)
	}
}

// TestProgressReachesUpstreamThroughFailures: progress is reported up in order, retried while
// the Upstream fails, and a post is answered once its report is delivered; a report the control
// plane rejects is answered 409, dropped, and does not block the next.
func TestProgressReachesUpstreamThroughFailures(t *testing.T) {
	t.Parallel()
	up := newRecorder()
	up.failN, up.failErr = 3, errors.New("session down")
	ts := startSite(t, fixture(t, t.TempDir(), up))
	must(t, ts.SetPlan(testPlan(siteapi.UnknownInspect)))
	tok := ts.bootToken(t, macRamdisk)
	var want []siteapi.Progress
	for i, phase := range []string{siteapi.PhaseStarted, siteapi.PhaseWipe, siteapi.PhaseDone} {
		p := siteapi.Progress{Machine: "m-ramdisk", Task: "task-1", Phase: phase, Bytes: int64(i)}
		want = append(want, p)
		if status, body, _ := ts.do(t, "POST", siteapi.PathProgress, tok, toJSON(t, p)); status != http.StatusNoContent {
			t.Fatalf("progress %s: %d %s", phase, status, body)
		}
	}
	got := ts.up.waitFor(t, "three progress reports", func(s []sent) bool { return len(s) == 3 })
	if diff := cmp.Diff(want, ofKind[siteapi.Progress](got, siteapi.KindTaskProgress)); diff != "" {
		t.Errorf("progress reported (-want +got):\n%s", diff)
	}

	up.mu.Lock()
	up.failN, up.failErr = 1, fmt.Errorf("bad payload: %w", ErrRejected)
	calls := up.calls
	up.mu.Unlock()
	post := func(task string) (int, string) {
		status, body, _ := ts.do(t, "POST", siteapi.PathProgress, tok, toJSON(t, siteapi.Progress{Machine: "m-ramdisk", Task: task, Phase: siteapi.PhaseStarted}))
		return status, body
	}
	if status, body := post("rejected"); status != http.StatusConflict || !strings.Contains(body, "rejected") {
		t.Fatalf("progress the control plane rejects: %d %s, want 409 saying why", status, body)
	}
	if status, body := post("after"); status != http.StatusNoContent {
		t.Fatalf("progress after the rejected one: %d %s", status, body)
	}
	got = ts.up.waitFor(t, "the report after the rejected one", func(s []sent) bool { return len(s) == 4 })
	if last := got[3].Payload.(siteapi.Progress); last.Task != "after" {
		t.Errorf("last report %+v, want task after", last)
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	if up.calls != calls+2 {
		t.Errorf("%d calls for a rejected report and the next, want 2: a rejected one is not retried", up.calls-calls)
	}
}

// TestProgressWaitsForTheControlPlane: while the Upstream is stuck, a progress post is answered
// 503 (retry) once it has waited its time, or at once when the queue is full: a ramdisk is told
// its progress is in only when the control plane has it. What was queued is delivered, in
// order, once the Upstream recovers.
func TestProgressWaitsForTheControlPlane(t *testing.T) {
	t.Parallel()
	up := newRecorder()
	up.gate, up.atGate = make(chan struct{}), make(chan struct{}, 1)
	cfg := fixture(t, t.TempDir(), up)
	cfg.ReportQueue = 1
	ts := startSite(t, cfg)
	ts.progressWait = 2 * time.Second // far above what an answer "at once" takes on a loaded machine
	must(t, ts.SetPlan(testPlan(siteapi.UnknownInspect)))
	tok := ts.bootToken(t, macRamdisk)
	post := func(task string) (int, string) {
		status, body, _ := ts.do(t, "POST", siteapi.PathProgress, tok,
			toJSON(t, siteapi.Progress{Machine: "m-ramdisk", Task: task, Phase: siteapi.PhaseStarted}))
		return status, body
	}
	start := time.Now()
	if status, body := post("a"); status != http.StatusServiceUnavailable || !strings.Contains(body, "retry") || time.Since(start) < ts.progressWait {
		t.Fatalf("a post the control plane has not recorded: %d %s after %s, want 503 (retry) after waiting", status, body, time.Since(start))
	}
	select { // the sender took "a" out of the queue, and waits on the Upstream with it
	case <-up.atGate:
	case <-time.After(5 * time.Second):
		t.Fatal("the sender did not take the first report to the Upstream within 5s")
	}
	if status, _ := post("b"); status != http.StatusServiceUnavailable { // queued, then its wait ends
		t.Fatalf("second: %d, want 503", status)
	}
	start = time.Now()
	if status, _ := post("c"); status != http.StatusServiceUnavailable || time.Since(start) > ts.progressWait/2 {
		t.Fatalf("a post to a full queue: %d after %s, want 503 at once", status, time.Since(start))
	}
	close(up.gate)
	got := up.waitFor(t, "the queued reports", func(s []sent) bool { return len(s) == 2 })
	for i, p := range ofKind[siteapi.Progress](got, siteapi.KindTaskProgress) {
		if want := []string{"a", "b"}[i]; p.Task != want {
			t.Errorf("report %d is task %s, want %s", i, p.Task, want)
		}
	}
	if status, body := post("d"); status != http.StatusNoContent {
		t.Fatalf("once the control plane is back: %d %s, want 204", status, body)
	}
}
