-- Tunnel tickets: each opens one tunnel (a command on a node, or its console) within a minute of
-- its making, once. Stored hashed; the ticket itself is shown once.

-- +goose Up
CREATE TABLE compute.access_tickets (
  id             uuid PRIMARY KEY,
  token_hash     bytea NOT NULL UNIQUE CHECK (length(token_hash) = 32),
  tenant_id      text NOT NULL,
  principal      text NOT NULL,
  node_id        uuid NOT NULL,
  reservation_id uuid,
  kind           text NOT NULL CHECK (kind IN ('exec', 'console')),
  argv           text[] NOT NULL DEFAULT '{}',
  tty            boolean NOT NULL DEFAULT false,
  cols           integer NOT NULL DEFAULT 0,
  rows           integer NOT NULL DEFAULT 0,
  console        text NOT NULL DEFAULT '',
  expires_at     timestamptz NOT NULL,
  used_at        timestamptz,
  created_at     timestamptz NOT NULL DEFAULT compute.compute_now()
);
CREATE INDEX access_tickets_expiry ON compute.access_tickets (expires_at);

-- +goose Down
DROP TABLE compute.access_tickets;
