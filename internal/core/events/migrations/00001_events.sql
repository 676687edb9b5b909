-- The event outbox: what happened, written in the transaction that made it happen. Webhooks and
-- the event stream read it; nothing is sent "after commit, hopefully".

-- +goose Up
CREATE TABLE compute.events (
  id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  type       text NOT NULL CHECK (type ~ '^[a-z]+(\.[a-z_]+)+$'),
  tenant_id  text NOT NULL,
  subject    text NOT NULL, -- the id of what it is about
  data       jsonb NOT NULL DEFAULT '{}',
  created_at timestamptz NOT NULL DEFAULT compute.compute_now()
);
CREATE INDEX events_subject ON compute.events (subject, id);
CREATE INDEX events_tenant ON compute.events (tenant_id, id);

-- +goose Down
DROP TABLE compute.events;
