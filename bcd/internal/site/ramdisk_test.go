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

// TestHello: a ramdisk's hello is answered with the machine its MACs name and that machine's
// token, and its facts reach the Upstream as KindMachineSeen; an unknown machine is answered
// with neither and reported without a machine.
func TestHello(t *testing.T) {
	ts := startSite(t, fixture(t, t.TempDir(), newRecorder()))
	hello := toJSON(t, siteapi.Hello{Facts: facts(macUnknown, macSecond)})

	// Before the first plan the site cannot tell who it is: retry.
	status, body, h := ts.do(t, "POST", siteapi.PathHello, "", hello)
	if status != http.StatusServiceUnavailable || h.Get("Retry-After") == "" {
		t.Fatalf("hello before any plan: %d %s (Retry-After %q), want 503 with Retry-After", status, body, h.Get("Retry-After"))
	}

	must(t, ts.SetPlan(testPlan(siteapi.UnknownInspect)))
	status, body, _ = ts.do(t, "POST", siteapi.PathHello, "", hello)
	var ans siteapi.HelloAnswer
	if status != http.StatusOK || json.Unmarshal([]byte(body), &ans) != nil {
		t.Fatalf("hello: %d %s", status, body)
	}
	if diff := cmp.Diff(siteapi.HelloAnswer{Machine: "m-ramdisk", Token: "tok-ramdisk"}, ans); diff != "" {
		t.Errorf("answer (-want +got):\n%s", diff)
	}

	status, body, _ = ts.do(t, "POST", siteapi.PathHello, "", toJSON(t, siteapi.Hello{Facts: facts(macUnknown)}))
	if status != http.StatusOK || strings.TrimSpace(body) != "{}" {
		t.Errorf("hello of an unknown machine: %d %s, want 200 {}", status, body)
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
	ts := startSite(t, fixture(t, t.TempDir(), newRecorder()))
	must(t, ts.SetPlan(testPlan(siteapi.UnknownInspect)))
	good := `{"machine":"m-ramdisk","task":"task-1","phase":"wipe"}`
	cases := []struct {
		name, path, token, body string
		status                  int
		says                    string
	}{
		{"hello: empty", siteapi.PathHello, "", "", 400, "body: empty"},
		{"hello: not JSON", siteapi.PathHello, "", "{facts:", 400, "body: not JSON"},
		{"hello: truncated", siteapi.PathHello, "", `{"facts":{"serial":"x"`, 400, "body: the JSON ends too early"},
		{"hello: an array", siteapi.PathHello, "", `[1]`, 400, "body: must be a JSON object"},
		{"hello: unknown field", siteapi.PathHello, "", `{"facts":{"serial":"S","macs":["` + macRamdisk + `"]},"extra":1}`, 400, "extra: unknown field"},
		{"hello: nested unknown field", siteapi.PathHello, "", `{"facts":{"serial":"S","macs":["` + macRamdisk + `"],"colour":"red"}}`, 400, "colour: unknown field"},
		{"hello: wrong type", siteapi.PathHello, "", `{"facts":{"serial":"S","macs":["` + macRamdisk + `"],"cpus":"many"}}`, 400, "facts.cpus: must be a number"},
		{"hello: no serial", siteapi.PathHello, "", `{"facts":{"macs":["` + macRamdisk + `"]}}`, 400, "facts.serial"},
		{"hello: bad MAC", siteapi.PathHello, "", `{"facts":{"serial":"S","macs":["52:54:00:00:00:0G"]}}`, 400, "facts.macs"},
		{"hello: control characters", siteapi.PathHello, "", `{"machine":"a\u0007","facts":{"serial":"S","macs":["` + macRamdisk + `"]}}`, 400, "machine:"},
		{"hello: two values", siteapi.PathHello, "", `{"facts":{"serial":"S","macs":["` + macRamdisk + `"]}} {}`, 400, "more than one JSON value"},
		{"hello: too large", siteapi.PathHello, "", `{"facts":{"serial":"` + strings.Repeat("x", helloLimit) + `"}}`, 413, "body: larger than"},
		{"hello: two machines' MACs", siteapi.PathHello, "", toJSON(t, siteapi.Hello{Facts: facts(macRamdisk, macDisk)}), 409, "facts.macs: name two machines"},
		{"progress: bad phase", siteapi.PathProgress, "tok-ramdisk", `{"machine":"m-ramdisk","task":"task-1","phase":"dancing"}`, 400, "phase:"},
		{"progress: bytes over total", siteapi.PathProgress, "tok-ramdisk", `{"machine":"m-ramdisk","task":"task-1","phase":"download","bytes":9,"total":5}`, 400, "bytes:"},
		{"progress: no task", siteapi.PathProgress, "tok-ramdisk", `{"machine":"m-ramdisk","phase":"wipe"}`, 400, "task:"},
		{"progress: unknown field", siteapi.PathProgress, "tok-ramdisk", `{"machine":"m-ramdisk","task":"task-1","phase":"wipe","percent":5}`, 400, "percent: unknown field"},
		{"progress: bytes a string", siteapi.PathProgress, "tok-ramdisk", `{"machine":"m-ramdisk","task":"task-1","phase":"wipe","bytes":"5"}`, 400, "bytes: must be a number"},
		{"progress: too large", siteapi.PathProgress, "tok-ramdisk", `{"machine":"m-ramdisk","task":"task-1","phase":"failed","error":"` + strings.Repeat("e", progressLimit) + `"}`, 413, "body: larger than"},
		{"progress: no token", siteapi.PathProgress, "", good, 401, "not this machine's token"},
		{"progress: another machine's token", siteapi.PathProgress, "tok-disk", good, 401, "not this machine's token"},
		{"progress: unknown machine", siteapi.PathProgress, "tok-ramdisk", `{"machine":"m-gone","task":"task-1","phase":"wipe"}`, 401, "not this machine's token"},
		{"task: no machine", siteapi.PathTask, "tok-ramdisk", "", 400, "machine: the query parameter is required"},
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

// TestTask: a machine's task goes only to the bearer of its current token; 204 while it has
// none; a new plan's token replaces the old one.
func TestTask(t *testing.T) {
	ts := startSite(t, fixture(t, t.TempDir(), newRecorder()))
	must(t, ts.SetPlan(testPlan(siteapi.UnknownInspect)))
	path := siteapi.PathTask + "?machine=m-ramdisk"
	for _, token := range []string{"", "tok-disk", "tok-ramdis", "tok-ramdisk2"} {
		if status, body, _ := ts.do(t, "GET", path, token, ""); status != http.StatusUnauthorized {
			t.Errorf("token %q: %d %s, want 401", token, status, body)
		}
	}
	status, body, _ := ts.do(t, "GET", path, "tok-ramdisk", "")
	var task siteapi.Task
	if status != http.StatusOK || json.Unmarshal([]byte(body), &task) != nil {
		t.Fatalf("task: %d %s", status, body)
	}
	if diff := cmp.Diff(*testPlan("").Machines[0].Task, task); diff != "" {
		t.Errorf("task (-want +got):\n%s", diff)
	}
	if status, body, _ := ts.do(t, "GET", siteapi.PathTask+"?machine=m-idle", "tok-idle", ""); status != http.StatusNoContent || body != "" {
		t.Errorf("machine without a task: %d %q, want 204", status, body)
	}
	if status, _, _ := ts.do(t, "GET", siteapi.PathTask+"?machine=m-gone", "tok-ramdisk", ""); status != http.StatusUnauthorized {
		t.Errorf("a machine not in the plan: %d, want 401", status)
	}

	// The next task comes with a new token: the old one stops working.
	p := testPlan(siteapi.UnknownInspect)
	p.Machines[0].Token = "tok-ramdisk-2"
	p.Machines[0].Task = &siteapi.Task{ID: "task-2", Kind: siteapi.TaskInspect, Then: siteapi.ThenPowerOff}
	must(t, ts.SetPlan(p))
	if status, _, _ := ts.do(t, "GET", path, "tok-ramdisk", ""); status != http.StatusUnauthorized {
		t.Errorf("the previous token: %d, want 401", status)
	}
	if status, body, _ := ts.do(t, "GET", path, "tok-ramdisk-2", ""); status != http.StatusOK || !strings.Contains(body, `"task-2"`) {
		t.Errorf("the new token: %d %s, want task-2", status, body)
	}
}

// TestProgressReachesUpstreamThroughFailures: progress is reported up in order, retried while
// the Upstream fails, and a post is answered once its report is delivered; a report the control
// plane rejects is answered 409, dropped, and does not block the next.
func TestProgressReachesUpstreamThroughFailures(t *testing.T) {
	up := newRecorder()
	up.failN, up.failErr = 3, errors.New("session down")
	ts := startSite(t, fixture(t, t.TempDir(), up))
	must(t, ts.SetPlan(testPlan(siteapi.UnknownInspect)))
	var want []siteapi.Progress
	for i, phase := range []string{siteapi.PhaseStarted, siteapi.PhaseWipe, siteapi.PhaseDone} {
		p := siteapi.Progress{Machine: "m-ramdisk", Task: "task-1", Phase: phase, Bytes: int64(i)}
		want = append(want, p)
		if status, body, _ := ts.do(t, "POST", siteapi.PathProgress, "tok-ramdisk", toJSON(t, p)); status != http.StatusNoContent {
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
		status, body, _ := ts.do(t, "POST", siteapi.PathProgress, "tok-ramdisk", toJSON(t, siteapi.Progress{Machine: "m-ramdisk", Task: task, Phase: siteapi.PhaseStarted}))
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
	up := newRecorder()
	up.gate = make(chan struct{})
	cfg := fixture(t, t.TempDir(), up)
	cfg.ReportQueue = 1
	ts := startSite(t, cfg)
	ts.progressWait = 2 * time.Second // far above what an answer "at once" takes on a loaded machine
	must(t, ts.SetPlan(testPlan(siteapi.UnknownInspect)))
	post := func(task string) (int, string) {
		status, body, _ := ts.do(t, "POST", siteapi.PathProgress, "tok-ramdisk",
			toJSON(t, siteapi.Progress{Machine: "m-ramdisk", Task: task, Phase: siteapi.PhaseStarted}))
		return status, body
	}
	start := time.Now()
	if status, body := post("a"); status != http.StatusServiceUnavailable || !strings.Contains(body, "retry") || time.Since(start) < ts.progressWait {
		t.Fatalf("a post the control plane has not recorded: %d %s after %s, want 503 (retry) after waiting", status, body, time.Since(start))
	}
	for deadline := time.Now().Add(5 * time.Second); len(ts.reports.q) > 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond) // until the sender holds it
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
