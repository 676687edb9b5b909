package nodes

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/internal/fleet"
	"github.com/better-compute/compute/postgres"
)

// The sessions table says which gateway holds each node's session, at which epoch, and until when
// a silent session keeps its node online. Its writers take the node's row lock first (a claim, a
// heartbeat flush), so one that holds it reads sessions that do not move under it.

// OpenSession records gateway as the holder of node's session at the next epoch (1 for the
// node's first), seen now and online for grace, and returns the epoch. The caller holds the
// node's row lock.
func OpenSession(ctx context.Context, q postgres.Querier, node, gateway, agentVersion string, grace time.Duration) (int64, error) {
	var epoch int64
	err := q.QueryRow(ctx, `INSERT INTO compute.node_sessions (node_id, gateway_id, epoch, agent_version, connected_at, last_seen_at, offline_after)
		VALUES ($1, $2, 1, $3, compute.compute_now(), compute.compute_now(), compute.compute_now() + make_interval(secs => $4))
		ON CONFLICT (node_id) DO UPDATE SET gateway_id = excluded.gateway_id, epoch = compute.node_sessions.epoch + 1,
		  agent_version = excluded.agent_version, connected_at = excluded.connected_at, last_seen_at = excluded.last_seen_at,
		  offline_after = excluded.offline_after, closed_at = NULL
		RETURNING epoch`, node, gateway, agentVersion, grace.Seconds()).Scan(&epoch)
	return epoch, err
}

// SessionSeen is a heartbeat of a session at an epoch, and the grace its silence has from then.
type SessionSeen struct {
	Node  string
	Epoch int64
	At    time.Time
	Grace time.Duration
}

// TouchSessions records the heartbeats of the sessions gateway still holds at their epochs, and
// returns those sessions' nodes: a heartbeat of a session taken over or closed since is not its
// holder's.
// The caller holds the nodes' row locks.
func TouchSessions(ctx context.Context, q postgres.Querier, gateway string, seen []SessionSeen) ([]string, error) {
	ids, epochs, at, graces := make([]string, len(seen)), make([]int64, len(seen)), make([]time.Time, len(seen)), make([]float64, len(seen))
	for i, s := range seen {
		ids[i], epochs[i], at[i], graces[i] = s.Node, s.Epoch, s.At, s.Grace.Seconds()
	}
	rows, err := q.Query(ctx, `UPDATE compute.node_sessions s SET last_seen_at = u.t, offline_after = u.t + make_interval(secs => u.g)
		FROM unnest($1::uuid[], $2::bigint[], $3::timestamptz[], $4::float8[]) AS u(n, e, t, g)
		WHERE s.node_id = u.n AND s.epoch = u.e AND s.gateway_id = $5 AND s.closed_at IS NULL
		RETURNING s.node_id::text`, ids, epochs, at, graces, gateway)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// CloseSession closes gateway's session of node at epoch, whose stream ended (the agent stopped,
// the connection closed), and takes the node offline at once, without waiting for its grace
// period. A session taken over since (a newer epoch, here or at another gateway) is left alone:
// the newer one holds the node. It reports whether the node went offline.
func CloseSession(ctx context.Context, db *postgres.DB, node, gateway string, epoch int64) (bool, error) {
	var gone bool
	err := db.Tx(ctx, func(tx pgx.Tx) error {
		// The node's row first, as every writer of nodes and sessions takes it; a claim elsewhere
		// waits for it, or has already moved the epoch and the update below matches nothing.
		if err := fleet.LockNodes(ctx, tx, []string{node}); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `UPDATE compute.node_sessions SET closed_at = compute.compute_now(), offline_after = compute.compute_now()
			WHERE node_id = $1 AND gateway_id = $2 AND epoch = $3 AND closed_at IS NULL`, node, gateway, epoch)
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		n, err := takeOffline(ctx, tx, []string{node}, map[string]any{"gateway": gateway, "closed": true})
		gone = n == 1
		return err
	})
	return gone, err
}
