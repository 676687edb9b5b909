-- What a gateway's safety-net poll reads: only what changed lately, by index, not every node it
-- holds.

-- +goose Up
CREATE INDEX node_desired_updated ON compute.node_desired (updated_at);
CREATE INDEX node_sessions_connected ON compute.node_sessions (connected_at);

-- +goose Down
DROP INDEX compute.node_sessions_connected;
DROP INDEX compute.node_desired_updated;
