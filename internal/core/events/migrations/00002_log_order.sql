-- The event log's order. An event's row id is taken when it is inserted, but transactions commit
-- in another order: a reader that resumed after the last id it saw would miss an event of a
-- longer transaction that committed later with a smaller id. So each event gets its place in
-- the log, seq, after it has committed, from one sequencer at a time (an advisory lock), in
-- transactions that commit one after another: seq is 1, 2, 3, … with no gap, and a reader that
-- saw seq n has seen every event before it. Only events with a seq are read.

-- +goose Up
ALTER TABLE compute.events ADD COLUMN seq bigint;
CREATE UNIQUE INDEX events_seq ON compute.events (seq);
CREATE INDEX events_unsequenced ON compute.events (id) WHERE seq IS NULL;
CREATE INDEX events_tenant_seq ON compute.events (tenant_id, seq) WHERE seq IS NOT NULL;

-- +goose Down
DROP INDEX compute.events_tenant_seq;
DROP INDEX compute.events_unsequenced;
DROP INDEX compute.events_seq;
ALTER TABLE compute.events DROP COLUMN seq;
