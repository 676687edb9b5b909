-- Webhooks: endpoints a tenant's events are sent to, and one delivery row per event and
-- endpoint. The webhooks package alone writes these tables; the attempts themselves are River
-- jobs (compute.river_job), enqueued in the transaction that creates or revives a delivery.

-- +goose Up
CREATE TABLE compute.webhook_endpoints (
  id                   uuid PRIMARY KEY,
  tenant_id            text NOT NULL,
  url                  text NOT NULL CHECK (length(url) <= 2048),
  description          text NOT NULL DEFAULT '',
  event_types          text[] NOT NULL DEFAULT '{}', -- exact types or prefixes ending in '.'; empty: all
  secret               bytea NOT NULL,               -- sealed (SecretBox, purpose webhook:<id>)
  previous_secret      bytea,                        -- sealed; signs beside secret until previous_until
  previous_until       timestamptz,
  after_seq            bigint NOT NULL,              -- deliveries are of events after this one
  created_by           text NOT NULL,
  created_at           timestamptz NOT NULL DEFAULT compute.compute_now()
);
CREATE INDEX webhook_endpoints_tenant ON compute.webhook_endpoints (tenant_id, id);

CREATE TABLE compute.webhook_deliveries (
  id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  endpoint_id     uuid NOT NULL REFERENCES compute.webhook_endpoints ON DELETE CASCADE,
  event_seq       bigint NOT NULL,
  subject         text NOT NULL,
  state           text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'dead')),
  generation      int NOT NULL DEFAULT 1,           -- bumped by a redelivery: older jobs stand down
  attempts        int NOT NULL DEFAULT 0,
  due_at          timestamptz NOT NULL DEFAULT compute.compute_now(), -- the dead-letter age counts from here
  next_attempt_at timestamptz,
  claimed_until   timestamptz,                      -- an attempt is in flight until then
  delivered_at    timestamptz,
  created_at      timestamptz NOT NULL DEFAULT compute.compute_now(),
  UNIQUE (endpoint_id, event_seq)
);
-- A delivery waits for the pending ones of the same endpoint and subject before it (order per subject).
CREATE INDEX webhook_deliveries_pending ON compute.webhook_deliveries (endpoint_id, subject, event_seq) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_endpoint ON compute.webhook_deliveries (endpoint_id, id);

CREATE TABLE compute.webhook_attempts (
  delivery_id bigint NOT NULL REFERENCES compute.webhook_deliveries ON DELETE CASCADE,
  n           int NOT NULL,
  at          timestamptz NOT NULL,
  status      int NOT NULL DEFAULT 0,
  error       text NOT NULL DEFAULT '',
  seconds     double precision NOT NULL,
  PRIMARY KEY (delivery_id, n)
);

-- The fan-out's place in the event log: every event up to seq has its deliveries.
CREATE TABLE compute.webhook_fanout (
  one boolean PRIMARY KEY DEFAULT true CHECK (one),
  seq bigint NOT NULL
);
INSERT INTO compute.webhook_fanout (seq) SELECT coalesce(max(seq), 0) FROM compute.events;

-- +goose Down
DROP TABLE compute.webhook_fanout;
DROP TABLE compute.webhook_attempts;
DROP TABLE compute.webhook_deliveries;
DROP TABLE compute.webhook_endpoints;
