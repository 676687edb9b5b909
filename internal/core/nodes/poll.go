package nodes

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/postgres"
)

// Work is what a gateway's poll found: the gateway keeps what concerns the sessions it holds.
type Work struct {
	Commands []string         // nodes with a pending command
	Desired  map[string]int64 // node → its desired generation, moved within the lookback
	Sessions map[string]int64 // node → epoch of a session opened at another gateway within the lookback
}

// pollQuery reads, each part by a range of one index and in proportion to what changed rather
// than to the fleet: the nodes with pending commands (commands_open), the desired states moved
// since $2 seconds ago (node_desired_updated) and the sessions opened at other gateways since
// (node_sessions_connected).
const pollQuery = `SELECT DISTINCT 'c', node_id::text, 0::bigint FROM compute.commands WHERE state = 'pending'
	UNION ALL
	SELECT 'd', node_id::text, generation FROM compute.node_desired
		WHERE updated_at > compute.compute_now() - make_interval(secs => $2)
	UNION ALL
	SELECT 's', node_id::text, epoch FROM compute.node_sessions
		WHERE connected_at > compute.compute_now() - make_interval(secs => $2) AND gateway_id <> $1`

// Poll returns the work for gateway's sessions that a lost notification may have left undone,
// changed within lookback: a change older than that was announced, or is caught up with whole
// when the gateway listens again.
func Poll(ctx context.Context, q postgres.Querier, gateway string, lookback time.Duration) (Work, error) {
	w := Work{Desired: map[string]int64{}, Sessions: map[string]int64{}}
	rows, err := q.Query(ctx, pollQuery, gateway, lookback.Seconds())
	if err != nil {
		return w, err
	}
	var kind, node string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&kind, &node, &n}, func() error {
		switch kind {
		case "c":
			w.Commands = append(w.Commands, node)
		case "d":
			w.Desired[node] = n
		case "s":
			w.Sessions[node] = max(w.Sessions[node], n)
		}
		return nil
	})
	return w, err
}
