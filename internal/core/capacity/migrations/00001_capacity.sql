-- Capacity: what can be booked (devices, node resources), the rollups of what is free now,
-- reservations and their bookings (with how far each has been billed), and quotas.
--
-- Atoms. Every claim is a booking of a contiguous range of atoms of one resource of one node over
-- a time range. GPU g owns the 64 positions [64g, 64g+64): a whole GPU books all of them; MIG
-- memory slice k is the 8 positions [64g+8k, 64g+8k+8), so a MIG profile placed at slice s of
-- size n books [64g+8s, 64g+8(s+n)); time-slice share i books the one position 64g+i. A vCPU or a
-- GiB of memory is one atom. One EXCLUDE constraint then refuses every double booking the
-- hardware would refuse.

-- +goose Up
CREATE TABLE compute.devices (
  id            uuid PRIMARY KEY,
  node_id       uuid NOT NULL REFERENCES compute.nodes (id) ON DELETE CASCADE,
  index         integer NOT NULL CHECK (index BETWEEN 0 AND 255),
  uuid          text NOT NULL CHECK (length(uuid) BETWEEN 1 AND 128),
  name          text NOT NULL CHECK (length(name) BETWEEN 1 AND 128), -- as the hardware reports it
  model         text NOT NULL CHECK (model ~ '^[a-z0-9][a-z0-9.-]{0,63}$'), -- the model key, e.g. h100
  memory_mib    bigint NOT NULL CHECK (memory_mib >= 0),
  pci_address   text NOT NULL DEFAULT '',
  nvlink_domain text NOT NULL DEFAULT '',
  health        text NOT NULL DEFAULT 'healthy' CHECK (health IN ('unknown', 'healthy', 'degraded', 'unhealthy')),
  mode          text NOT NULL DEFAULT 'whole' CHECK (mode IN ('whole', 'mig', 'timeslice')),
  shares        integer NOT NULL DEFAULT 0 CHECK ((mode = 'timeslice') = (shares BETWEEN 2 AND 64) AND (mode = 'timeslice' OR shares = 0)),
  updated_at    timestamptz NOT NULL DEFAULT compute.compute_now(),
  UNIQUE (node_id, index),
  UNIQUE (uuid)
);

CREATE TABLE compute.node_resources (
  node_id    uuid PRIMARY KEY REFERENCES compute.nodes (id) ON DELETE CASCADE,
  vcpus      integer NOT NULL CHECK (vcpus BETWEEN 0 AND 65536),
  memory_gib integer NOT NULL CHECK (memory_gib BETWEEN 0 AND 1048576),
  updated_at timestamptz NOT NULL DEFAULT compute.compute_now()
);

-- The rollup of what each node has free now, kept in the transactions that change it, so that the
-- placer and the pool views never scan bookings. Whole-mode, not unhealthy GPUs only.
CREATE TABLE compute.node_capacity (
  node_id      uuid PRIMARY KEY REFERENCES compute.nodes (id) ON DELETE CASCADE,
  pool_id      uuid NOT NULL,
  schedulable  boolean NOT NULL DEFAULT false, -- the node is active, online and not unhealthy
  gpu_model    text NOT NULL DEFAULT '', -- the model of its whole-mode GPUs; 'mixed' if several
  gpus_total   integer NOT NULL DEFAULT 0,
  gpus_free    integer NOT NULL DEFAULT 0, -- no booking now
  gpus_spot    integer NOT NULL DEFAULT 0, -- held by spot bookings only
  mig_gpus     integer NOT NULL DEFAULT 0,
  ts_gpus      integer NOT NULL DEFAULT 0,
  vcpus_total  integer NOT NULL DEFAULT 0,
  vcpus_used   integer NOT NULL DEFAULT 0,
  vcpus_spot   integer NOT NULL DEFAULT 0,
  memory_total integer NOT NULL DEFAULT 0,
  memory_used  integer NOT NULL DEFAULT 0,
  memory_spot  integer NOT NULL DEFAULT 0,
  CHECK (gpus_free >= 0 AND gpus_spot >= 0 AND gpus_free + gpus_spot <= gpus_total),
  CHECK (vcpus_used + vcpus_spot <= vcpus_total AND memory_used + memory_spot <= memory_total)
);
-- The placer walks these in best-fit order and stops at the first unlocked node that fits.
CREATE INDEX node_capacity_model_fit ON compute.node_capacity (pool_id, gpu_model, gpus_free, node_id) WHERE schedulable;
CREATE INDEX node_capacity_fit ON compute.node_capacity (pool_id, gpus_free, node_id) WHERE schedulable;
CREATE INDEX node_capacity_pool ON compute.node_capacity (pool_id);

CREATE TABLE compute.reservations (
  id          uuid PRIMARY KEY,
  tenant_id   text NOT NULL CHECK (tenant_id <> ''),
  pool_id     uuid NOT NULL REFERENCES compute.pools (id) ON DELETE RESTRICT,
  state       text NOT NULL CHECK (state IN ('pending', 'active', 'released', 'cancelled', 'expired', 'preempted')),
  spot        boolean NOT NULL DEFAULT false,
  shape       jsonb NOT NULL,
  members     integer NOT NULL CHECK (members BETWEEN 1 AND 256),
  -- what counts against quotas: {"gpus": {"h100": 8}, "vcpus": 32, "memoryGiB": 256}
  claims      jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(claims) = 'object'),
  starts_at   timestamptz NOT NULL,
  ends_at     timestamptz, -- NULL: until released
  end_reason  text CHECK (end_reason IN ('preempted')), -- set ahead when a future end is a preemption
  ended_at    timestamptz,
  labels      jsonb NOT NULL DEFAULT '{}' CHECK (compute.valid_labels(labels)),
  created_by  text NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT compute.compute_now(),
  updated_at  timestamptz NOT NULL DEFAULT compute.compute_now(),
  CHECK (ends_at IS NULL OR ends_at > starts_at),
  CHECK ((state IN ('pending', 'active')) = (ended_at IS NULL))
);
CREATE INDEX reservations_tenant ON compute.reservations (tenant_id, id);
CREATE INDEX reservations_live ON compute.reservations (state, starts_at, ends_at) WHERE state IN ('pending', 'active');

-- The state table, enforced here rather than hoped for in Go.
-- +goose StatementBegin
CREATE FUNCTION compute.reservation_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.state = OLD.state THEN
    RETURN NEW;
  END IF;
  IF (OLD.state, NEW.state) NOT IN (
      ('pending', 'active'), ('pending', 'cancelled'), ('pending', 'preempted'), ('pending', 'expired'),
      ('active', 'released'), ('active', 'expired'), ('active', 'preempted')) THEN
    RAISE EXCEPTION 'reservation % cannot go from % to %', OLD.id, OLD.state, NEW.state
      USING ERRCODE = 'check_violation', CONSTRAINT = 'reservation_transition';
  END IF;
  RETURN NEW;
END $$;
-- +goose StatementEnd
CREATE TRIGGER reservation_transition BEFORE UPDATE OF state ON compute.reservations
  FOR EACH ROW EXECUTE FUNCTION compute.reservation_transition();

CREATE TABLE compute.bookings (
  id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  reservation_id uuid NOT NULL REFERENCES compute.reservations (id) ON DELETE CASCADE,
  member         integer NOT NULL CHECK (member >= 0),
  node_id        uuid NOT NULL REFERENCES compute.nodes (id) ON DELETE RESTRICT,
  resource       text NOT NULL CHECK (resource IN ('gpu', 'cpu', 'memory')),
  kind           text NOT NULL CHECK (kind IN ('gpu', 'mig', 'share', 'vcpu', 'memory')),
  atoms          int4range NOT NULL CHECK (NOT isempty(atoms) AND lower(atoms) >= 0 AND NOT upper_inf(atoms)),
  during         tstzrange NOT NULL CHECK (NOT isempty(during) AND NOT lower_inf(during)),
  spot           boolean NOT NULL DEFAULT false,
  model          text NOT NULL DEFAULT '', -- the GPU model, for GPU bookings
  units          double precision NOT NULL CHECK (units > 0), -- GPUs (fractions for MIG and shares), vCPUs or GiB
  billed_until   timestamptz, -- how far its reserved time has been handed to billing
  CONSTRAINT bookings_no_double_booking
    EXCLUDE USING gist (node_id WITH =, resource WITH =, atoms WITH &&, during WITH &&)
);
CREATE INDEX bookings_reservation ON compute.bookings (reservation_id);
-- What billing has yet to hand over.
CREATE INDEX bookings_unbilled ON compute.bookings (id)
  WHERE billed_until IS NULL OR upper_inf(during) OR billed_until < upper(during);

-- Quotas: a limit and what is counted against it, changed in the booking transaction under the
-- row's lock, so that concurrent bookings cannot both slip under it.
CREATE TABLE compute.quotas (
  tenant_id  text NOT NULL,
  pool_id    uuid NOT NULL REFERENCES compute.pools (id) ON DELETE CASCADE,
  resource   text NOT NULL CHECK (resource IN ('gpus', 'vcpus', 'memoryGiB')),
  model      text NOT NULL DEFAULT '' CHECK (resource = 'gpus' OR model = ''),
  "limit"    integer NOT NULL CHECK ("limit" >= 0),
  used       integer NOT NULL DEFAULT 0 CHECK (used >= 0),
  updated_at timestamptz NOT NULL DEFAULT compute.compute_now(),
  PRIMARY KEY (tenant_id, pool_id, resource, model)
);

-- +goose Down
DROP TABLE compute.quotas;
DROP TABLE compute.bookings;
DROP TRIGGER reservation_transition ON compute.reservations;
DROP FUNCTION compute.reservation_transition();
DROP TABLE compute.reservations;
DROP TABLE compute.node_capacity;
DROP TABLE compute.node_resources;
DROP TABLE compute.devices;
