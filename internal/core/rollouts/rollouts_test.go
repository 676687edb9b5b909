package rollouts_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/agent/ext"
	agentv1 "github.com/better-compute/compute/agent/v1"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/core/fleet"
	"github.com/better-compute/compute/internal/core/releases/releasetest"
	"github.com/better-compute/compute/internal/lib/tufrepo"
	"github.com/better-compute/compute/internal/node/nodeagent"
	"github.com/better-compute/compute/postgres/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// simNode is a node agent that updates itself as bcd would, without a binary: told a release by
// the bcd.release part, it stops its session and starts again reporting that version. A
// release in broken never comes back: the node drops off for a moment and returns on the
// version it ran (as bcd rolls back a binary that fails), and refuses that try again.
type simNode struct {
	t       *testing.T
	name    string
	store   *nodeagent.MemoryStore
	hw      *nodeagent.FakeHardware
	gateway string
	broken  map[string]bool

	mu      sync.Mutex
	version string
	failed  map[string]bool // tries rolled back
	cancel  context.CancelFunc
	done    chan struct{}
}

func (n *simNode) start() {
	n.mu.Lock()
	defer n.mu.Unlock()
	facts := &agentv1.MachineFacts{Hostname: n.name, MachineId: "m-" + n.name, Os: "linux", Arch: "amd64", AgentVersion: n.version}
	a, err := nodeagent.New(nodeagent.Config{Store: n.store, Hardware: n.hw, Version: n.version, Facts: facts, Gateway: n.gateway,
		MaxBackoff: 300 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Extensions: []ext.Extension{{Name: "sim-release", Desired: map[string]ext.Converger{api.BCDReleaseKind: n.apply}}}})
	if err != nil {
		n.t.Error(err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel, n.done = cancel, make(chan struct{})
	done := n.done
	go func() {
		defer close(done)
		_ = a.Run(ctx)
	}()
}

func (n *simNode) stop() {
	n.mu.Lock()
	cancel, done := n.cancel, n.done
	n.cancel = nil
	n.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

func (n *simNode) apply(_ context.Context, _ uint32, payload []byte) error {
	if payload == nil {
		return nil
	}
	var r api.BCDRelease
	if err := json.Unmarshal(payload, &r); err != nil {
		return err
	}
	try := fmt.Sprintf("%s/%s#%d", r.Version, r.Rollout, r.Attempt)
	n.mu.Lock()
	defer n.mu.Unlock()
	if r.Version == n.version {
		return nil
	}
	if n.failed[try] {
		return nil // rolled back in this try: it stays (bcd does the same)
	}
	broken := n.broken[r.Version]
	if broken {
		n.failed[try] = true
	}
	go func() {
		n.stop()
		time.Sleep(200 * time.Millisecond) // bcd's restart takes a moment: the behaviour simulated, not a wait
		if !broken {
			n.mu.Lock()
			n.version = r.Version
			n.mu.Unlock()
		}
		n.start()
	}()
	return nil
}

type harness struct {
	env   *computetest.Env
	ctx   context.Context
	url   string
	gw    string
	repo  *releasetest.Repo
	nodes []*simNode
}

var (
	v1 = tufrepo.Build{Version: "v1.0.0", OS: "linux", Arch: "amd64"}
	v2 = tufrepo.Build{Version: "v2.0.0", OS: "linux", Arch: "amd64"}
	v3 = tufrepo.Build{Version: "v3.0.0-broken", OS: "linux", Arch: "amd64"}
)

// newHarness is a control plane with releases v1, v2 and v3 (broken on the nodes) published, and
// a pool p1 of n simulated nodes on v1.
func newHarness(t *testing.T, n int, opts computetest.Options) *harness {
	opts.Configure = func(o *compute.Options) { o.HeartbeatInterval = 300 * time.Millisecond }
	env := computetest.New(t, opts)
	h := &harness{env: env, ctx: context.Background(), url: env.Server(t)}
	h.gw, _ = env.Gateway(t, "")
	h.repo = releasetest.Init(t, env, h.url)
	h.repo.Publish(t, map[tufrepo.Build][]byte{v1: []byte("bcd v1"), v2: []byte("bcd v2"), v3: []byte("bcd v3")})
	a := env.Compute.API
	if _, err := a.Pools.Create(h.ctx, env.RootKey, api.CreatePool{Name: "p1"}); err != nil {
		t.Fatal(err)
	}
	jt, err := a.JoinTokens.Create(h.ctx, env.RootKey, api.CreateJoinToken{Pool: "p1", MaxUses: 10})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		h.join(t, fmt.Sprintf("n%d", i), jt.Token)
	}
	h.waitOnline(t, n)
	return h
}

func (h *harness) join(t *testing.T, name, token string) *simNode {
	facts := &agentv1.MachineFacts{Hostname: name, MachineId: "m-" + name, Os: "linux", Arch: "amd64", AgentVersion: v1.Version}
	id, err := nodeagent.Join(h.ctx, &http.Client{Timeout: 10 * time.Second}, h.url, token, facts)
	if err != nil {
		t.Fatal(err)
	}
	n := &simNode{t: t, name: name, store: nodeagent.NewMemoryStore(), hw: nodeagent.NewFakeHardware(name, 1, "NVIDIA H100 80GB HBM3"),
		gateway: h.gw, broken: map[string]bool{v3.Version: true}, version: v1.Version, failed: map[string]bool{}}
	if err := n.store.SetIdentity(id); err != nil {
		t.Fatal(err)
	}
	n.start()
	t.Cleanup(n.stop)
	h.nodes = append(h.nodes, n)
	return n
}

func (h *harness) waitOnline(t *testing.T, n int) {
	computetest.Eventually(t, 20*time.Second, fmt.Sprintf("%d nodes online", n), func() bool {
		page, err := h.env.Compute.API.Nodes.List(h.ctx, h.env.RootKey, api.ListNodes{Pool: "p1"})
		if err != nil {
			return false
		}
		up := 0
		for _, n := range page.Items {
			if n.Status == api.NodeOnline {
				up++
			}
		}
		return up == n
	})
}

func (h *harness) rollout(t *testing.T, id string) api.Rollout {
	t.Helper()
	r, err := h.env.Compute.API.Rollouts.Get(h.ctx, h.env.RootKey, api.RolloutRef{Rollout: id})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (h *harness) waitState(t *testing.T, id, state string, within time.Duration) api.Rollout {
	t.Helper()
	var r api.Rollout
	computetest.Eventually(t, within, "rollout "+state, func() bool {
		r = h.rollout(t, id)
		if r.State != state && (r.State == api.RolloutSucceeded || r.State == api.RolloutFailed || r.State == api.RolloutRolledBack) {
			t.Fatalf("rollout ended %s (%s), want %s", r.State, r.Error, state)
		}
		return r.State == state
	})
	return r
}

func (h *harness) events(t *testing.T, subject string) []string {
	t.Helper()
	page, err := h.env.Compute.API.Events.List(h.ctx, h.env.RootKey, api.ListEvents{Subject: subject, PageRequest: api.PageRequest{Limit: 100}})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range page.Items {
		out = append(out, e.Type)
	}
	return out
}

// TestRolloutInWaves rolls v2 out to three nodes with a budget of two: two waves, the second
// started only once the first's nodes are back online on v2.
func TestRolloutInWaves(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 3, computetest.Options{})
	a := h.env.Compute.API
	r, err := a.Rollouts.Create(h.ctx, h.env.RootKey, api.CreateRollout{Pool: "p1", Release: v2.Version, MaxUnavailable: 2, WaveDeadline: "30s"})
	if err != nil {
		t.Fatal(err)
	}
	if r.State != api.RolloutRunning || r.Total != 3 || r.MaxUnavailable != 2 || r.WaveDeadline != "30s" || r.OnFailure != api.OnFailurePause {
		t.Fatalf("created %+v", r)
	}
	// A second rollout of the pool waits for this one.
	_, err = a.Rollouts.Create(h.ctx, h.env.RootKey, api.CreateRollout{Pool: "p1", Release: v1.Version})
	if api.CodeOf(err) != api.CodeConflict {
		t.Fatalf("a second rollout of the pool = %v, want conflict", err)
	}
	r = h.waitState(t, r.ID, api.RolloutSucceeded, 60*time.Second)
	if r.Updated != 3 || len(r.Waves) != 2 || len(r.Waves[0].Nodes) != 2 || len(r.Waves[1].Nodes) != 1 || r.FinishedAt == nil {
		t.Fatalf("succeeded: %+v", r)
	}
	for _, w := range r.Waves {
		if w.State != api.WaveSucceeded || w.FinishedAt == nil {
			t.Fatalf("wave %+v", w)
		}
	}
	if !r.Waves[1].StartedAt.After(*r.Waves[0].FinishedAt) && !r.Waves[1].StartedAt.Equal(*r.Waves[0].FinishedAt) {
		t.Fatalf("wave 2 started (%s) before wave 1 finished (%s)", r.Waves[1].StartedAt, *r.Waves[0].FinishedAt)
	}
	for _, n := range r.Nodes {
		if n.State != api.RolloutNodeUpdated || n.Version != v2.Version || n.PreviousVersion != v1.Version || !n.Online || n.Attempts != 1 {
			t.Fatalf("node %+v", n)
		}
	}
	// The log is sequenced shortly after the commits.
	want := []string{"rollout.created", "rollout.wave_started", "rollout.wave_succeeded", "rollout.wave_started", "rollout.wave_succeeded", "rollout.succeeded"}
	computetest.Eventually(t, 30*time.Second, "the rollout's events", func() bool { return slices.Equal(h.events(t, r.ID), want) })
	// A succeeded rollout can be rolled back: every node returns to v1.
	if _, err := a.Rollouts.Rollback(h.ctx, h.env.RootKey, api.RolloutRef{Rollout: r.ID}); err != nil {
		t.Fatal(err)
	}
	r = h.waitState(t, r.ID, api.RolloutRolledBack, 60*time.Second)
	for _, n := range r.Nodes {
		if n.State != api.RolloutNodeReverted || n.Version != v1.Version {
			t.Fatalf("after the rollback: node %+v", n)
		}
	}
	if list, err := a.Rollouts.List(h.ctx, h.env.RootKey, api.ListRollouts{Pool: "p1", State: api.RolloutRolledBack}); err != nil || len(list.Items) != 1 || list.Items[0].ID != r.ID {
		t.Fatalf("rollouts.list = %+v, %v", list, err)
	}
}

// TestFailingWavePauses rolls out a release the nodes never come back on: the first wave fails
// at its deadline and the rollout pauses with the second wave never started; resumed, the wave
// is tried again and fails again; rolled back, its node returns to v1. With onFailure rollback,
// the same failure rolls back by itself.
func TestFailingWavePauses(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 2, computetest.Options{})
	a := h.env.Compute.API
	r, err := a.Rollouts.Create(h.ctx, h.env.RootKey, api.CreateRollout{Pool: "p1", Release: v3.Version, WaveDeadline: "10s"})
	if err != nil {
		t.Fatal(err)
	}
	r = h.waitState(t, r.ID, api.RolloutPaused, 40*time.Second)
	if r.Wave != 1 || len(r.Waves) != 1 || r.Waves[0].State != api.WaveFailed || !strings.Contains(r.Error, "wave 1 failed: n0 did not come back online on v3.0.0-broken") {
		t.Fatalf("paused: %+v", r)
	}
	if r.Nodes[0].Name != "n0" || r.Nodes[0].State != api.RolloutNodeFailed || r.Nodes[0].Version != v1.Version ||
		r.Nodes[1].State != api.RolloutNodePending {
		t.Fatalf("nodes after the failed wave: %+v", r.Nodes)
	}
	computetest.Eventually(t, 30*time.Second, "the failed wave's events", func() bool {
		ev := h.events(t, r.ID)
		return slices.Contains(ev, "rollout.wave_failed") && slices.Contains(ev, "rollout.paused")
	})
	// Paused, it stays paused: the second node is never told v3. Its job ended with the pause,
	// and only a resume makes another: once none is left to run, nothing advances it.
	computetest.Eventually(t, 30*time.Second, "no job of the paused rollout left to run", func() bool {
		return computetest.Count(t, h.env.DB.Pool, `SELECT count(*) FROM compute.river_job WHERE kind = 'rollout.advance' AND args->>'rollout' = $1
			AND state NOT IN ('completed', 'cancelled', 'discarded')`, r.ID) == 0
	})
	if r2 := h.rollout(t, r.ID); r2.State != api.RolloutPaused || r2.Nodes[1].State != api.RolloutNodePending {
		t.Fatalf("a paused rollout moved: %+v", r2)
	}
	if _, err := a.Rollouts.Pause(h.ctx, h.env.RootKey, api.RolloutRef{Rollout: r.ID}); api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("pausing a paused rollout = %v", err)
	}
	// Resumed: n0 is tried again (a new try, which the node takes), and fails again.
	if r, err = a.Rollouts.Resume(h.ctx, h.env.RootKey, api.RolloutRef{Rollout: r.ID}); err != nil || r.State != api.RolloutRunning || r.Nodes[0].Attempts != 2 {
		t.Fatalf("resume = %+v, %v", r, err)
	}
	r = h.waitState(t, r.ID, api.RolloutPaused, 40*time.Second)
	if r.Nodes[0].State != api.RolloutNodeFailed || r.Nodes[1].State != api.RolloutNodePending {
		t.Fatalf("after the second failure: %+v", r.Nodes)
	}
	if r, err = a.Rollouts.Rollback(h.ctx, h.env.RootKey, api.RolloutRef{Rollout: r.ID}); err != nil || r.State != api.RolloutRollingBack {
		t.Fatalf("rollback = %+v, %v", r, err)
	}
	r = h.waitState(t, r.ID, api.RolloutRolledBack, 30*time.Second)
	if r.Nodes[0].State != api.RolloutNodeReverted || r.Nodes[1].State != api.RolloutNodeSkipped {
		t.Fatalf("rolled back: %+v", r.Nodes)
	}
	if _, err := a.Rollouts.Resume(h.ctx, h.env.RootKey, api.RolloutRef{Rollout: r.ID}); api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("resuming a rolled-back rollout = %v", err)
	}

	// onFailure rollback: the failed wave rolls the rollout back by itself.
	r, err = a.Rollouts.Create(h.ctx, h.env.RootKey, api.CreateRollout{Pool: "p1", Release: v3.Version, WaveDeadline: "10s", OnFailure: api.OnFailureRollback})
	if err != nil {
		t.Fatal(err)
	}
	r = h.waitState(t, r.ID, api.RolloutRolledBack, 60*time.Second)
	if !strings.Contains(r.Error, "wave 1 failed") || r.Nodes[0].State != api.RolloutNodeReverted {
		t.Fatalf("rolled back by itself: %+v", r)
	}
}

// TestRolloutKeepsTheDisruptionBudget: a node of the pool outside the rollout that is offline
// uses the budget up, and the rollout waits until it is back (here: retired).
func TestRolloutKeepsTheDisruptionBudget(t *testing.T) {
	t.Parallel()
	// The API and gateway in one process, the worker that advances rollouts in another, started
	// once the offline node is in place.
	h := newHarness(t, 2, computetest.Options{Mode: compute.ModeGateway})
	a := h.env.Compute.API
	r, err := a.Rollouts.Create(h.ctx, h.env.RootKey, api.CreateRollout{Pool: "p1", Release: v2.Version, MaxUnavailable: 1, WaveDeadline: "30s"})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := a.Pools.Get(h.ctx, h.env.RootKey, api.GetPool{Pool: "p1"})
	if err != nil {
		t.Fatal(err)
	}
	ghost, err := fleet.InsertNode(h.ctx, h.env.DB.Pool, fleet.NewNode{PoolID: pool.ID, Name: "ghost"})
	if err != nil {
		t.Fatal(err)
	}
	worker := computetest.Attach(t, h.env, computetest.Options{Mode: compute.ModeWorker})
	if err := worker.Compute.Start(h.ctx); err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, 20*time.Second, "the rollout waiting on the budget", func() bool {
		r = h.rollout(t, r.ID)
		return strings.Contains(r.Note, "1 nodes of the pool are unavailable")
	})
	if r.Wave != 0 || r.State != api.RolloutRunning {
		t.Fatalf("a wave started beyond the budget: %+v", r)
	}
	if _, err := a.Nodes.Retire(h.ctx, h.env.RootKey, api.RetireNode{NodeRef: api.NodeRef{Node: ghost.ID}}); err != nil {
		t.Fatal(err)
	}
	r = h.waitState(t, r.ID, api.RolloutSucceeded, 60*time.Second)
	if len(r.Waves) != 2 || r.Updated != 2 {
		t.Fatalf("succeeded: %+v", r)
	}
}

// TestRolloutRefusals checks what rollouts.create and the state changes refuse.
func TestRolloutRefusals(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{})
	ctx := context.Background()
	url := env.Server(t)
	a := env.Compute.API
	releasetest.Init(t, env, url).Publish(t, map[tufrepo.Build][]byte{v1: []byte("bcd v1")})
	if _, err := a.Pools.Create(ctx, env.RootKey, api.CreatePool{Name: "empty"}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		in   api.CreateRollout
		code api.Code
		text string
	}{
		{api.CreateRollout{Pool: "empty", Release: "v9"}, api.CodeNotFound, "v9"},
		{api.CreateRollout{Pool: "nope", Release: v1.Version}, api.CodeNotFound, "nope"},
		{api.CreateRollout{Pool: "empty", Release: v1.Version}, api.CodeFailedPrecondition, "no nodes"},
		{api.CreateRollout{Pool: "empty", Release: v1.Version, WaveDeadline: "1s"}, api.CodeInvalidArgument, "waveDeadline"},
		{api.CreateRollout{Pool: "empty", Release: v1.Version, OnFailure: "retry"}, api.CodeInvalidArgument, "onFailure"},
		{api.CreateRollout{Pool: "empty", Release: "../v1"}, api.CodeInvalidArgument, "release"},
	} {
		_, err := a.Rollouts.Create(ctx, env.RootKey, tc.in)
		if api.CodeOf(err) != tc.code || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("create %+v = %v, want %s containing %q", tc.in, err, tc.code, tc.text)
		}
	}
	// An arm64 node in a pool the release has no arm64 build for.
	p, _ := a.Pools.Get(ctx, env.RootKey, api.GetPool{Pool: "empty"})
	n, err := fleet.InsertNode(ctx, env.DB.Pool, fleet.NewNode{PoolID: p.ID, Name: "arm", Facts: map[string]any{"arch": "arm64"}})
	if err != nil {
		t.Fatal(err)
	}
	_ = n
	_, err = a.Rollouts.Create(ctx, env.RootKey, api.CreateRollout{Pool: "empty", Release: v1.Version})
	if api.CodeOf(err) != api.CodeFailedPrecondition || !strings.Contains(err.Error(), "no build for node arm (linux/arm64)") {
		t.Fatalf("a release without the node's platform = %v", err)
	}
	_, err = a.Rollouts.Get(ctx, env.RootKey, api.RolloutRef{Rollout: "0190a0b0-0000-7000-8000-000000000001"})
	if api.CodeOf(err) != api.CodeNotFound {
		t.Fatalf("get of an unknown rollout = %v", err)
	}
}
