package compat

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/client"
	"github.com/better-compute/compute/computetest"
)

// fleetCheck is what a user expects of a node whatever its version or its control plane's: it
// joins, comes online with its GPUs, converges the desired state (a reservation's CDI spec
// appears, and goes with its release) and runs a command.
type fleetCheck struct {
	cl      *client.Client
	db      *pgxpool.Pool // the control plane's database, for what the API does not show
	url, gw string        // the API (JoinService) and the gateway
	// refusal is the error a node acknowledges a reservation's desired state with, for a known
	// break; "" for none.
	refusal string
}

// node joins bcd (the binary bin) to a pool of its own named name, runs it, and checks it; it
// returns the node's id, its state directory and the running process.
func (f fleetCheck) node(t *testing.T, bin, name string) (string, string, *proc) {
	t.Helper()
	ctx := context.Background()
	if _, err := f.cl.Pools.Create(ctx, api.CreatePool{Name: name}); err != nil {
		t.Fatal(err)
	}
	tok, err := f.cl.JoinTokens.Create(ctx, api.CreateJoinToken{Pool: name})
	if err != nil {
		t.Fatal(err)
	}
	state, cdiDir := t.TempDir(), t.TempDir()
	if out, err := exec.Command(bin, "join", "--state-dir", state, "--url", f.url, "--token", tok.Token, "--hostname", name).CombinedOutput(); err != nil {
		t.Fatalf("%s join: %v\n%s", name, err, out)
	}
	p := start(t, bin, "node", "--state-dir", state, "--cdi-dir", cdiDir, "--gateway", f.gw, "--fake-gpus", "8", "--log-level", "warn")
	id := f.online(t, name)
	f.converges(t, name, id, cdiDir)
	return id, state, p
}

// online waits for the pool's one node to be online with its 8 GPUs and returns its id.
func (f fleetCheck) online(t *testing.T, pool string) string {
	t.Helper()
	ctx := context.Background()
	var id string
	computetest.Eventually(t, 30*time.Second, pool+": the node online with 8 GPUs", func() bool {
		list, err := f.cl.Nodes.List(ctx, api.ListNodes{Pool: pool})
		if err != nil || len(list.Items) != 1 || list.Items[0].Status != api.NodeOnline {
			return false
		}
		id = list.Items[0].ID
		devs, err := f.cl.Devices.List(ctx, api.ListDevices{Node: id})
		return err == nil && len(devs) == 8
	})
	return id
}

// converges books 2 GPUs of the pool's node and waits for their CDI spec, runs a health check
// there, and releases the GPUs.
func (f fleetCheck) converges(t *testing.T, pool, node, cdiDir string) {
	t.Helper()
	ctx := context.Background()
	r, err := f.cl.Reservations.Create(ctx, api.CreateReservation{Pool: pool, Shape: api.Shape{GPUs: 2}})
	if err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join(cdiDir, "better-compute-"+r.ID+".json")
	computetest.Eventually(t, 30*time.Second, pool+": the reservation's CDI spec", func() bool {
		b, err := os.ReadFile(spec)
		return err == nil && strings.Contains(string(b), r.Allocations[0].GPUs[0].UUID)
	})
	f.applied(t, pool, node, f.refusal)
	cmd, err := f.cl.Commands.Create(ctx, api.CreateCommand{NodeRef: api.NodeRef{Node: node}, Kind: api.CommandHealthCheck})
	if err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, 30*time.Second, pool+": the health check's result", func() bool {
		c, err := f.cl.Commands.Get(ctx, api.GetCommand{Command: cmd.ID})
		return err == nil && c.State == api.CommandSucceeded
	})
	if _, err := f.cl.Reservations.Release(ctx, api.ReleaseReservation{Reservation: r.ID}); err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, 30*time.Second, pool+": the spec removed", func() bool {
		_, err := os.Stat(spec)
		return os.IsNotExist(err)
	})
}

// applied waits for the node to have acknowledged its desired state as applied, without an
// error (or with refusal, when a known break is expected): a spec written is not enough, when a
// part of the state the node did not converge makes it say so.
func (f fleetCheck) applied(t *testing.T, pool, node, refusal string) {
	t.Helper()
	var gen, applied int64
	var why string
	var err error
	defer func() {
		if t.Failed() {
			t.Logf("%s: generation %d, applied %d, error %q (%v)", pool, gen, applied, why, err)
		}
	}()
	computetest.Eventually(t, 30*time.Second, pool+": the desired state applied", func() bool {
		err = f.db.QueryRow(context.Background(), `SELECT generation, applied_generation, applied_error FROM compute.node_desired WHERE node_id = $1`, node).
			Scan(&gen, &applied, &why)
		return err == nil && applied >= gen && why == refusal
	})
}

// TestOldNodesAgainstThisControlPlane is the skew matrix's node side: bcd as built at each
// earlier protocol (releases) joins this tree's control plane, comes online, converges its
// desired state and runs a command, ignoring what it does not know of the messages sent to it.
func TestOldNodesAgainstThisControlPlane(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds bcd at older commits")
	}
	env := computetest.New(t, computetest.Options{Configure: func(o *compute.Options) { o.HeartbeatInterval = 300 * time.Millisecond }})
	url := env.Server(t)
	gw, _ := env.Gateway(t, "")
	cl, err := client.New(url, client.WithAPIKey(env.RootKey))
	if err != nil {
		t.Fatal(err)
	}
	f := fleetCheck{cl: cl, db: env.DB.Pool, url: url, gw: gw}
	for _, r := range releases {
		t.Run(r.name, func(t *testing.T) {
			bin := buildAt(t, r.commit, "./bcd")
			f := f
			f.refusal = r.refusal
			f.node(t, bin, strings.ToLower(strings.ReplaceAll(r.name, "-", "minus")))
		})
	}
}
