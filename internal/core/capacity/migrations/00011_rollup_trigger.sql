-- The rollup is maintained by its owner: compute.refresh_node_capacity(nodes) is the one recount
-- (capacity's refreshSQL calls it), and a trigger on compute.nodes calls it for the nodes whose
-- state, status, health or pool a statement changed, so that no writer of node rows has to
-- remember to. The trigger runs after the statement's node rows are locked and takes their
-- rollups' locks after them: nodes, then rollups, the lock order of docs/capacity.md.

-- +goose Up
-- +goose StatementBegin
-- refresh_node_capacity recomputes the rollups of nodes from their devices and the bookings that
-- hold something now. It is a recount, never a delta: a rollup is exact after every call, however
-- stale it was before (a booking that ended while no worker had ticked yet, a concurrent change).
-- Each node's bookings are read through the exclusion constraint's index, so it is cheap enough
-- to run in every transaction that changes the node.
CREATE FUNCTION compute.refresh_node_capacity(nodes uuid[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  as_of timestamptz;
BEGIN
  -- The rollup rows first, in node order, then the recount in a later statement: under READ
  -- COMMITTED each statement of a volatile function takes a fresh snapshot, which then includes
  -- every change to these nodes by the transactions that held the locks before us. Computing
  -- first and locking second would let a concurrent booking's count be overwritten.
  PERFORM 1 FROM compute.node_capacity WHERE node_id = ANY(nodes) ORDER BY node_id FOR UPDATE;
  -- As of now, once the locks are held: not of the transaction's start (compute_now() without a
  -- test clock), nor of the client's statement (statement_timestamp(), which is older than any
  -- wait inside it). A transaction that began before a booking's end and waited for the node's
  -- lock behind the worker's tick for that end would otherwise recount the ended booking as held,
  -- after the tick, and no later change would correct it.
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

-- Statement-level, with transition tables, so that a write of many nodes recounts them in one
-- call. A column list (UPDATE OF state, ...) cannot be combined with transition tables, so the
-- update's trigger compares old and new rows itself: a heartbeat's last_seen_at or a report's
-- facts recount nothing.
CREATE FUNCTION compute.nodes_refresh_capacity() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  changed uuid[];
BEGIN
  IF TG_OP = 'INSERT' THEN
    changed := ARRAY(SELECT id FROM new_nodes);
  ELSE
    changed := ARRAY(SELECT n.id FROM new_nodes n JOIN old_nodes o USING (id)
      WHERE (n.state, n.status, n.health, n.pool_id) IS DISTINCT FROM (o.state, o.status, o.health, o.pool_id));
  END IF;
  IF cardinality(changed) > 0 THEN
    PERFORM compute.refresh_node_capacity(changed);
  END IF;
  RETURN NULL;
END $$;
-- +goose StatementEnd

CREATE TRIGGER nodes_capacity_insert AFTER INSERT ON compute.nodes
  REFERENCING NEW TABLE AS new_nodes FOR EACH STATEMENT EXECUTE FUNCTION compute.nodes_refresh_capacity();
CREATE TRIGGER nodes_capacity_update AFTER UPDATE ON compute.nodes
  REFERENCING OLD TABLE AS old_nodes NEW TABLE AS new_nodes FOR EACH STATEMENT EXECUTE FUNCTION compute.nodes_refresh_capacity();

-- +goose Down
DROP TRIGGER nodes_capacity_update ON compute.nodes;
DROP TRIGGER nodes_capacity_insert ON compute.nodes;
DROP FUNCTION compute.nodes_refresh_capacity();
DROP FUNCTION compute.refresh_node_capacity(uuid[]);
