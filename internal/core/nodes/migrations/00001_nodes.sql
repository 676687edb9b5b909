-- Nodes at work: sessions (which gateway holds each node, at which epoch), desired
-- state generations, and commands.

-- +goose Up
-- Which gateway holds a node's session. A reconnect anywhere takes it over with the next epoch;
-- a gateway whose epoch is stale lets go.
CREATE TABLE compute.node_sessions (
  node_id       uuid PRIMARY KEY REFERENCES compute.nodes (id) ON DELETE CASCADE,
  gateway_id    text NOT NULL,
  epoch         bigint NOT NULL,
  agent_version text NOT NULL DEFAULT '',
  connected_at  timestamptz NOT NULL,
  last_seen_at  timestamptz NOT NULL,
  offline_after timestamptz NOT NULL -- the grace period: silent until then, the node goes offline
);
CREATE INDEX node_sessions_offline ON compute.node_sessions (offline_after);

-- Desired state: a generation that moves whenever what a node should hold changes (its bookings,
-- their reservations' states), and the generation the node last applied.
CREATE TABLE compute.node_desired (
  node_id            uuid PRIMARY KEY REFERENCES compute.nodes (id) ON DELETE CASCADE,
  generation         bigint NOT NULL DEFAULT 1,
  applied_generation bigint NOT NULL DEFAULT 0,
  applied_error      text NOT NULL DEFAULT '',
  updated_at         timestamptz NOT NULL DEFAULT compute.compute_now()
);

-- +goose StatementBegin
CREATE FUNCTION compute.bump_desired() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  -- In node order, so that concurrent transactions take these rows in one order.
  INSERT INTO compute.node_desired AS d (node_id, generation)
  SELECT DISTINCT node_id, 2 FROM changed ORDER BY node_id
  ON CONFLICT (node_id) DO UPDATE SET generation = d.generation + 1, updated_at = compute.compute_now();
  PERFORM pg_catalog.pg_notify('compute_desired', n::text) FROM (SELECT DISTINCT node_id AS n FROM changed) x;
  RETURN NULL;
END $$;

CREATE FUNCTION compute.bump_desired_of_reservations() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO compute.node_desired AS d (node_id, generation)
  SELECT DISTINCT b.node_id, 2 FROM compute.bookings b JOIN changed r ON r.id = b.reservation_id ORDER BY b.node_id
  ON CONFLICT (node_id) DO UPDATE SET generation = d.generation + 1, updated_at = compute.compute_now();
  PERFORM pg_catalog.pg_notify('compute_desired', n::text)
  FROM (SELECT DISTINCT b.node_id AS n FROM compute.bookings b JOIN changed r ON r.id = b.reservation_id) x;
  RETURN NULL;
END $$;
-- +goose StatementEnd

CREATE TRIGGER bookings_desired_insert AFTER INSERT ON compute.bookings
  REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION compute.bump_desired();
CREATE TRIGGER bookings_desired_update AFTER UPDATE ON compute.bookings
  REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION compute.bump_desired();
CREATE TRIGGER bookings_desired_delete AFTER DELETE ON compute.bookings
  REFERENCING OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION compute.bump_desired();
CREATE TRIGGER reservations_desired AFTER UPDATE ON compute.reservations
  REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION compute.bump_desired_of_reservations();

CREATE TABLE compute.commands (
  id            uuid PRIMARY KEY,
  tenant_id     text NOT NULL,
  node_id       uuid NOT NULL REFERENCES compute.nodes (id) ON DELETE CASCADE,
  kind          text NOT NULL CHECK (kind IN ('inventory.refresh', 'gpu.reset', 'health.check', 'diag.run')),
  args          jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(args) = 'object'),
  state         text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'dispatched', 'succeeded', 'failed', 'cancelled')),
  deadline      timestamptz NOT NULL,
  result        jsonb,
  error         text NOT NULL DEFAULT '',
  attempts      integer NOT NULL DEFAULT 0,
  created_by    text NOT NULL,
  created_at    timestamptz NOT NULL DEFAULT compute.compute_now(),
  dispatched_at timestamptz,
  finished_at   timestamptz,
  CHECK ((state IN ('pending', 'dispatched')) = (finished_at IS NULL))
);
CREATE INDEX commands_open ON compute.commands (node_id, created_at) WHERE state IN ('pending', 'dispatched');
CREATE INDEX commands_deadline ON compute.commands (deadline) WHERE state IN ('pending', 'dispatched');
CREATE INDEX commands_tenant ON compute.commands (tenant_id, id);

-- +goose Down
DROP TABLE compute.commands;
DROP TRIGGER reservations_desired ON compute.reservations;
DROP TRIGGER bookings_desired_delete ON compute.bookings;
DROP TRIGGER bookings_desired_update ON compute.bookings;
DROP TRIGGER bookings_desired_insert ON compute.bookings;
DROP FUNCTION compute.bump_desired_of_reservations();
DROP FUNCTION compute.bump_desired();
DROP TABLE compute.node_desired;
DROP TABLE compute.node_sessions;
