package nodes_test

import (
	"context"
	"testing"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/core/events"
	"github.com/better-compute/compute/internal/core/nodes"
)

// TestOverdueCommandsFailWithAnEventEach: commands past their deadline fail, each with the
// reason for its state, and each is recorded as a command.finished event; a command still within
// its deadline is left alone.
func TestOverdueCommandsFailWithAnEventEach(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{})
	ctx := context.Background()
	for _, q := range []string{
		`INSERT INTO compute.pools (id, tenant_id, name) VALUES ('00000000-0000-0000-0000-000000000001', 'root', 'p')`,
		`INSERT INTO compute.nodes (id, tenant_id, pool_id, name) VALUES ('00000000-0000-0000-0001-000000000001', 'root', '00000000-0000-0000-0000-000000000001', 'n1')`,
		`INSERT INTO compute.commands (id, tenant_id, node_id, kind, state, deadline, created_by, dispatched_at) VALUES
		  ('00000000-0000-0000-0002-000000000001', 'root', '00000000-0000-0000-0001-000000000001', 'health.check', 'pending', now() - interval '1 s', 't', NULL),
		  ('00000000-0000-0000-0002-000000000002', 'root', '00000000-0000-0000-0001-000000000001', 'gpu.reset', 'dispatched', now() - interval '1 s', 't', now()),
		  ('00000000-0000-0000-0002-000000000003', 'root', '00000000-0000-0000-0001-000000000001', 'health.check', 'pending', now() + interval '1 h', 't', NULL)`,
	} {
		if _, err := env.DB.Pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	n, err := nodes.FailOverdueCommands(ctx, env.DB.Pool)
	if err != nil || n != 2 {
		t.Fatalf("failed %d overdue commands, %v; want 2", n, err)
	}
	for id, want := range map[string]string{
		"00000000-0000-0000-0002-000000000001": "deadline exceeded: the node was not reached",
		"00000000-0000-0000-0002-000000000002": "deadline exceeded: the node did not report a result",
		"00000000-0000-0000-0002-000000000003": "",
	} {
		evs, err := events.About(ctx, env.DB.Pool, id)
		if err != nil {
			t.Fatal(err)
		}
		if want == "" {
			if len(evs) != 0 {
				t.Errorf("%s is within its deadline but has events %+v", id, evs)
			}
			continue
		}
		if len(evs) != 1 || evs[0].Type != "command.finished" || evs[0].Data["state"] != api.CommandFailed || evs[0].Data["error"] != want {
			t.Errorf("events of %s: %+v; want one command.finished failed with %q", id, evs, want)
		}
	}
}
