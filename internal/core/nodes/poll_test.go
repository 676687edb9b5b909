package nodes_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/core/nodes"
)

// TestPollReadsByIndex: with sequential scans priced out, every part of a gateway's poll is
// served by an index, so its cost follows what changed, not how many nodes the gateway holds.
func TestPollReadsByIndex(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{})
	ctx := context.Background()
	var plan []string
	err := env.DB.Tx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off`); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `EXPLAIN `+nodes.PollQuery, "gw", 60.0)
		if err != nil {
			return err
		}
		plan, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(plan, "\n")
	if strings.Contains(text, "Seq Scan") {
		t.Fatalf("the poll scans a table:\n%s", text)
	}
	for _, index := range []string{"node_desired_updated", "node_sessions_connected"} {
		if !strings.Contains(text, index) {
			t.Errorf("the poll does not use %s:\n%s", index, text)
		}
	}
}
