package nodes

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

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

// SessionClosed is a session whose stream ended.
type SessionClosed struct {
	Node  string
	Epoch int64
}

// CloseSessions closes gateway's sessions among closed, whose streams ended (the agent stopped,
// the connection closed), and takes their nodes offline at once, without waiting for their grace
// period, as MarkOffline does. A session taken over since (a newer epoch, here or at another
// gateway) is left alone: the newer one holds the node. The caller holds the nodes' row locks, so
// a claim elsewhere has either moved the epoch already or waits. It returns how many nodes went
// offline.
func CloseSessions(ctx context.Context, tx pgx.Tx, gateway string, closed []SessionClosed) (int, error) {
	ids, epochs := make([]string, len(closed)), make([]int64, len(closed))
	for i, c := range closed {
		ids[i], epochs[i] = c.Node, c.Epoch
	}
	rows, err := tx.Query(ctx, `UPDATE compute.node_sessions s SET closed_at = compute.compute_now(), offline_after = compute.compute_now()
		FROM unnest($1::uuid[], $2::bigint[]) AS u(n, e)
		WHERE s.node_id = u.n AND s.epoch = u.e AND s.gateway_id = $3 AND s.closed_at IS NULL
		RETURNING s.node_id::text`, ids, epochs, gateway)
	if err != nil {
		return 0, err
	}
	gone, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(gone) == 0 {
		return 0, err
	}
	return takeOffline(ctx, tx, gone, map[string]any{"gateway": gateway, "closed": true})
}
