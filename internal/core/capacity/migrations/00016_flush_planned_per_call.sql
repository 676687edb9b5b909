-- The rollup trigger on compute.nodes compares a statement's old and new rows. PL/pgSQL keeps a
-- statement's plan per connection from its first call, and the plan made for a gateway's first,
-- one-row heartbeat flush (a nested loop over the transition tables) took 9.3 s for a flush of
-- 10,000 rows, against 70 ms planned for its size: flushes fell behind and live nodes were marked
-- offline. EXECUTE plans the comparison at every call, for the rows it has
-- (TestBigFlushAfterASmallOne).

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION compute.nodes_refresh_capacity() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  changed uuid[];
BEGIN
  IF TG_OP = 'INSERT' THEN
    changed := ARRAY(SELECT id FROM new_nodes);
  ELSE
    EXECUTE 'SELECT ARRAY(SELECT n.id FROM new_nodes n JOIN old_nodes o USING (id)
      WHERE (n.state, n.status, n.health, n.pool_id) IS DISTINCT FROM (o.state, o.status, o.health, o.pool_id))' INTO changed;
  END IF;
  IF cardinality(changed) > 0 THEN
    PERFORM compute.refresh_node_capacity(changed);
  END IF;
  RETURN NULL;
END $$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION compute.nodes_refresh_capacity() RETURNS trigger LANGUAGE plpgsql AS $$
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
