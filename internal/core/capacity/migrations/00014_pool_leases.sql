-- The pool-lease placer (lease.go, docs/capacity.md "The pool lease"). One process at a time holds
-- a pool's lease and places the pool's common requests from memory; the exclusion constraint is
-- still the referee. What it needs of the database:
--
-- * compute.pool_leases: who holds each pool's lease, until when, and an epoch that grows at every
--   handover. Its clock is the database's real one (now()), not compute_now(): a lease measures
--   whether a process is alive, and a test that travels the booking clock must not expire it.
-- * node_capacity.changed: the transaction that last wrote the rollup row. The recount writes it
--   whenever the node's counts or state change, and the writers of what a placer reads that may
--   leave every count equal stamp it themselves (capacity's stampSQL: devices, bookings that start
--   later, their cancellation, an extension). A holder reads the rows changed since its last read
--   (by transaction id, against the oldest transaction still running then, so that a late commit
--   is never skipped) to learn what other writers did, and compares the value under the row's
--   lock before it writes (capacity's leaseLockSQL, which refuses through compute.lease_refuse).

-- +goose Up
CREATE TABLE compute.pool_leases (
  pool_id    uuid PRIMARY KEY REFERENCES compute.pools (id) ON DELETE CASCADE,
  holder     text NOT NULL CHECK (length(holder) BETWEEN 1 AND 256),
  epoch      bigint NOT NULL CHECK (epoch > 0),
  taken_at   timestamptz NOT NULL,
  expires_at timestamptz NOT NULL
);

ALTER TABLE compute.node_capacity ADD COLUMN changed xid8 NOT NULL DEFAULT pg_current_xact_id();
CREATE INDEX node_capacity_changed ON compute.node_capacity (pool_id, changed);

-- +goose StatementBegin
-- As 00013, and: a row written records the transaction that wrote it (changed).
CREATE OR REPLACE FUNCTION compute.refresh_node_capacity(nodes uuid[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  as_of timestamptz;
BEGIN
  PERFORM 1 FROM compute.node_capacity WHERE node_id = ANY(nodes) ORDER BY node_id FOR UPDATE;
  as_of := coalesce(nullif(pg_catalog.current_setting('compute.now', true), '')::timestamptz, pg_catalog.clock_timestamp());
  INSERT INTO compute.node_capacity AS nc (node_id, pool_id, schedulable, gpu_model, gpus_total, gpus_free, gpus_spot, mig_gpus, ts_gpus,
    vcpus_total, vcpus_used, vcpus_spot, memory_total, memory_used, memory_spot, changed)
  SELECT n.id, n.pool_id, n.state = 'active' AND n.status = 'online' AND n.health <> 'unhealthy',
    g.model, g.total, g.free, g.spot, g.mig, g.ts,
    coalesce(r.vcpus, 0), least(u.vcpus_used, coalesce(r.vcpus, 0)), least(u.vcpus_spot, greatest(coalesce(r.vcpus, 0) - u.vcpus_used, 0)),
    coalesce(r.memory_gib, 0), least(u.memory_used, coalesce(r.memory_gib, 0)), least(u.memory_spot, greatest(coalesce(r.memory_gib, 0) - u.memory_used, 0)),
    pg_catalog.pg_current_xact_id()
  FROM compute.nodes n
  LEFT JOIN compute.node_resources r ON r.node_id = n.id
  CROSS JOIN LATERAL (
    SELECT coalesce(array_agg(b.atoms) FILTER (WHERE b.resource = 'gpu' AND NOT b.spot), '{}') AS gpu_held,
      coalesce(array_agg(b.atoms) FILTER (WHERE b.resource = 'gpu' AND b.spot), '{}') AS gpu_spot,
      coalesce(sum(upper(b.atoms) - lower(b.atoms)) FILTER (WHERE b.resource = 'cpu' AND NOT b.spot), 0) AS vcpus_used,
      coalesce(sum(upper(b.atoms) - lower(b.atoms)) FILTER (WHERE b.resource = 'cpu' AND b.spot), 0) AS vcpus_spot,
      coalesce(sum(upper(b.atoms) - lower(b.atoms)) FILTER (WHERE b.resource = 'memory' AND NOT b.spot), 0) AS memory_used,
      coalesce(sum(upper(b.atoms) - lower(b.atoms)) FILTER (WHERE b.resource = 'memory' AND b.spot), 0) AS memory_spot
    FROM compute.bookings b WHERE b.node_id = n.id AND b.during @> as_of
  ) u
  CROSS JOIN LATERAL (
    SELECT coalesce(CASE WHEN count(DISTINCT d.model) FILTER (WHERE d.whole) > 1 THEN 'mixed' ELSE min(d.model) FILTER (WHERE d.whole) END, '') AS model,
      count(*) FILTER (WHERE d.whole) AS total,
      count(*) FILTER (WHERE d.whole AND NOT d.held AND NOT d.spot_held) AS free,
      count(*) FILTER (WHERE d.whole AND NOT d.held AND d.spot_held) AS spot,
      count(*) FILTER (WHERE d.mode = 'mig' AND d.ok) AS mig,
      count(*) FILTER (WHERE d.mode = 'timeslice' AND d.ok) AS ts
    FROM (
      SELECT d.model, d.mode, d.health <> 'unhealthy' AS ok, d.mode = 'whole' AND d.health <> 'unhealthy' AS whole,
        EXISTS (SELECT 1 FROM unnest(u.gpu_held) a WHERE a && int4range(d.index * 64, d.index * 64 + 64)) AS held,
        EXISTS (SELECT 1 FROM unnest(u.gpu_spot) a WHERE a && int4range(d.index * 64, d.index * 64 + 64)) AS spot_held
      FROM compute.devices d WHERE d.node_id = n.id
    ) d
  ) g
  WHERE n.id = ANY(nodes)
  ON CONFLICT (node_id) DO UPDATE SET pool_id = excluded.pool_id, schedulable = excluded.schedulable, gpu_model = excluded.gpu_model,
    gpus_total = excluded.gpus_total, gpus_free = excluded.gpus_free, gpus_spot = excluded.gpus_spot,
    mig_gpus = excluded.mig_gpus, ts_gpus = excluded.ts_gpus,
    vcpus_total = excluded.vcpus_total, vcpus_used = excluded.vcpus_used, vcpus_spot = excluded.vcpus_spot,
    memory_total = excluded.memory_total, memory_used = excluded.memory_used, memory_spot = excluded.memory_spot,
    changed = excluded.changed
  WHERE (nc.pool_id, nc.schedulable, nc.gpu_model, nc.gpus_total, nc.gpus_free, nc.gpus_spot, nc.mig_gpus, nc.ts_gpus,
      nc.vcpus_total, nc.vcpus_used, nc.vcpus_spot, nc.memory_total, nc.memory_used, nc.memory_spot)
    IS DISTINCT FROM (excluded.pool_id, excluded.schedulable, excluded.gpu_model, excluded.gpus_total, excluded.gpus_free, excluded.gpus_spot,
      excluded.mig_gpus, excluded.ts_gpus, excluded.vcpus_total, excluded.vcpus_used, excluded.vcpus_spot,
      excluded.memory_total, excluded.memory_used, excluded.memory_spot);
END $$;

-- lease_refuse is how capacity's leaseLockSQL, the first statement of a lease holder's write,
-- refuses it: with SQLSTATE BCL01 and the nodes whose memory is stale in the detail.
CREATE FUNCTION compute.lease_refuse(nodes text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'the pool lease holder''s memory of nodes % is stale', nodes USING ERRCODE = 'BCL01', DETAIL = nodes;
END $$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION compute.lease_refuse(text);
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION compute.refresh_node_capacity(nodes uuid[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  as_of timestamptz;
BEGIN
  PERFORM 1 FROM compute.node_capacity WHERE node_id = ANY(nodes) ORDER BY node_id FOR UPDATE;
  as_of := coalesce(nullif(pg_catalog.current_setting('compute.now', true), '')::timestamptz, pg_catalog.clock_timestamp());
  INSERT INTO compute.node_capacity AS nc (node_id, pool_id, schedulable, gpu_model, gpus_total, gpus_free, gpus_spot, mig_gpus, ts_gpus,
    vcpus_total, vcpus_used, vcpus_spot, memory_total, memory_used, memory_spot)
  SELECT n.id, n.pool_id, n.state = 'active' AND n.status = 'online' AND n.health <> 'unhealthy',
    g.model, g.total, g.free, g.spot, g.mig, g.ts,
    coalesce(r.vcpus, 0), least(u.vcpus_used, coalesce(r.vcpus, 0)), least(u.vcpus_spot, greatest(coalesce(r.vcpus, 0) - u.vcpus_used, 0)),
    coalesce(r.memory_gib, 0), least(u.memory_used, coalesce(r.memory_gib, 0)), least(u.memory_spot, greatest(coalesce(r.memory_gib, 0) - u.memory_used, 0))
  FROM compute.nodes n
  LEFT JOIN compute.node_resources r ON r.node_id = n.id
  CROSS JOIN LATERAL (
    SELECT coalesce(array_agg(b.atoms) FILTER (WHERE b.resource = 'gpu' AND NOT b.spot), '{}') AS gpu_held,
      coalesce(array_agg(b.atoms) FILTER (WHERE b.resource = 'gpu' AND b.spot), '{}') AS gpu_spot,
      coalesce(sum(upper(b.atoms) - lower(b.atoms)) FILTER (WHERE b.resource = 'cpu' AND NOT b.spot), 0) AS vcpus_used,
      coalesce(sum(upper(b.atoms) - lower(b.atoms)) FILTER (WHERE b.resource = 'cpu' AND b.spot), 0) AS vcpus_spot,
      coalesce(sum(upper(b.atoms) - lower(b.atoms)) FILTER (WHERE b.resource = 'memory' AND NOT b.spot), 0) AS memory_used,
      coalesce(sum(upper(b.atoms) - lower(b.atoms)) FILTER (WHERE b.resource = 'memory' AND b.spot), 0) AS memory_spot
    FROM compute.bookings b WHERE b.node_id = n.id AND b.during @> as_of
  ) u
  CROSS JOIN LATERAL (
    SELECT coalesce(CASE WHEN count(DISTINCT d.model) FILTER (WHERE d.whole) > 1 THEN 'mixed' ELSE min(d.model) FILTER (WHERE d.whole) END, '') AS model,
      count(*) FILTER (WHERE d.whole) AS total,
      count(*) FILTER (WHERE d.whole AND NOT d.held AND NOT d.spot_held) AS free,
      count(*) FILTER (WHERE d.whole AND NOT d.held AND d.spot_held) AS spot,
      count(*) FILTER (WHERE d.mode = 'mig' AND d.ok) AS mig,
      count(*) FILTER (WHERE d.mode = 'timeslice' AND d.ok) AS ts
    FROM (
      SELECT d.model, d.mode, d.health <> 'unhealthy' AS ok, d.mode = 'whole' AND d.health <> 'unhealthy' AS whole,
        EXISTS (SELECT 1 FROM unnest(u.gpu_held) a WHERE a && int4range(d.index * 64, d.index * 64 + 64)) AS held,
        EXISTS (SELECT 1 FROM unnest(u.gpu_spot) a WHERE a && int4range(d.index * 64, d.index * 64 + 64)) AS spot_held
      FROM compute.devices d WHERE d.node_id = n.id
    ) d
  ) g
  WHERE n.id = ANY(nodes)
  ON CONFLICT (node_id) DO UPDATE SET pool_id = excluded.pool_id, schedulable = excluded.schedulable, gpu_model = excluded.gpu_model,
    gpus_total = excluded.gpus_total, gpus_free = excluded.gpus_free, gpus_spot = excluded.gpus_spot,
    mig_gpus = excluded.mig_gpus, ts_gpus = excluded.ts_gpus,
    vcpus_total = excluded.vcpus_total, vcpus_used = excluded.vcpus_used, vcpus_spot = excluded.vcpus_spot,
    memory_total = excluded.memory_total, memory_used = excluded.memory_used, memory_spot = excluded.memory_spot
  WHERE (nc.pool_id, nc.schedulable, nc.gpu_model, nc.gpus_total, nc.gpus_free, nc.gpus_spot, nc.mig_gpus, nc.ts_gpus,
      nc.vcpus_total, nc.vcpus_used, nc.vcpus_spot, nc.memory_total, nc.memory_used, nc.memory_spot)
    IS DISTINCT FROM (excluded.pool_id, excluded.schedulable, excluded.gpu_model, excluded.gpus_total, excluded.gpus_free, excluded.gpus_spot,
      excluded.mig_gpus, excluded.ts_gpus, excluded.vcpus_total, excluded.vcpus_used, excluded.vcpus_spot,
      excluded.memory_total, excluded.memory_used, excluded.memory_spot);
END $$;
-- +goose StatementEnd
DROP INDEX compute.node_capacity_changed;
ALTER TABLE compute.node_capacity DROP COLUMN changed;
DROP TABLE compute.pool_leases;
