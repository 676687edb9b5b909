-- The recount reads each node's bookings that hold now once, through the exclusion constraint's
-- index, and matches them to the node's GPUs in memory; it used to probe that index twice per GPU
-- (held, spot-held), 16 probes for a node of 8 GPUs, and was the most expensive statement of a
-- placement. It writes a rollup only where the recount differs from it, so that an unchanged node
-- leaves no dead row versions in the placer's indexes. Same counts, same locks, same clock as
-- 00011, whose comments say why.

-- +goose Up
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
  -- The node's bookings that hold now, every resource, in one index scan.
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

-- +goose Down
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
    SELECT coalesce(CASE WHEN count(DISTINCT d.model) FILTER (WHERE d.whole) > 1 THEN 'mixed' ELSE min(d.model) FILTER (WHERE d.whole) END, '') AS model,
      count(*) FILTER (WHERE d.whole) AS total,
      count(*) FILTER (WHERE d.whole AND NOT d.held AND NOT d.spot_held) AS free,
      count(*) FILTER (WHERE d.whole AND NOT d.held AND d.spot_held) AS spot,
      count(*) FILTER (WHERE d.mode = 'mig' AND d.ok) AS mig,
      count(*) FILTER (WHERE d.mode = 'timeslice' AND d.ok) AS ts
    FROM (
      SELECT d.model, d.mode, d.health <> 'unhealthy' AS ok, d.mode = 'whole' AND d.health <> 'unhealthy' AS whole,
        EXISTS (SELECT 1 FROM compute.bookings b WHERE b.node_id = n.id AND b.resource = 'gpu' AND NOT b.spot
          AND b.atoms && int4range(d.index * 64, d.index * 64 + 64) AND b.during @> as_of) AS held,
        EXISTS (SELECT 1 FROM compute.bookings b WHERE b.node_id = n.id AND b.resource = 'gpu' AND b.spot
          AND b.atoms && int4range(d.index * 64, d.index * 64 + 64) AND b.during @> as_of) AS spot_held
      FROM compute.devices d WHERE d.node_id = n.id
    ) d
  ) g
  CROSS JOIN LATERAL (
    SELECT
      coalesce(sum(upper(b.atoms) - lower(b.atoms)) FILTER (WHERE b.resource = 'cpu' AND NOT b.spot), 0) AS vcpus_used,
      coalesce(sum(upper(b.atoms) - lower(b.atoms)) FILTER (WHERE b.resource = 'cpu' AND b.spot), 0) AS vcpus_spot,
      coalesce(sum(upper(b.atoms) - lower(b.atoms)) FILTER (WHERE b.resource = 'memory' AND NOT b.spot), 0) AS memory_used,
      coalesce(sum(upper(b.atoms) - lower(b.atoms)) FILTER (WHERE b.resource = 'memory' AND b.spot), 0) AS memory_spot
    FROM compute.bookings b WHERE b.node_id = n.id AND b.resource IN ('cpu', 'memory') AND b.during @> as_of
  ) u
  WHERE n.id = ANY(nodes)
  ON CONFLICT (node_id) DO UPDATE SET pool_id = excluded.pool_id, schedulable = excluded.schedulable, gpu_model = excluded.gpu_model,
    gpus_total = excluded.gpus_total, gpus_free = excluded.gpus_free, gpus_spot = excluded.gpus_spot,
    mig_gpus = excluded.mig_gpus, ts_gpus = excluded.ts_gpus,
    vcpus_total = excluded.vcpus_total, vcpus_used = excluded.vcpus_used, vcpus_spot = excluded.vcpus_spot,
    memory_total = excluded.memory_total, memory_used = excluded.memory_used, memory_spot = excluded.memory_spot;
END $$;
-- +goose StatementEnd
