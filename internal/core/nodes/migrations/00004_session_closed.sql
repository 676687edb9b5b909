-- A session whose stream ended is closed: its node went offline at once, and a heartbeat flush
-- that was already under way must not put it back online.

-- +goose Up
ALTER TABLE compute.node_sessions ADD COLUMN closed_at timestamptz;

-- +goose Down
ALTER TABLE compute.node_sessions DROP COLUMN closed_at;
