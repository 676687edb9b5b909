-- A booking's update moves its node's desired state only when what it holds changed (its window,
-- atoms, node or resource): billing's updates of billed_until used to bump the generation and
-- wake the node's gateway to push an unchanged state.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION compute.bump_desired_of_moved_bookings() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  moved uuid[];
BEGIN
  -- A booking moved from one node to another moves both.
  SELECT array_agg(DISTINCT m.node_id ORDER BY m.node_id) INTO moved
  FROM new_rows n JOIN old_rows o ON o.id = n.id
  CROSS JOIN LATERAL (VALUES (n.node_id), (o.node_id)) AS m(node_id)
  WHERE (n.during, n.atoms, n.node_id, n.resource) IS DISTINCT FROM (o.during, o.atoms, o.node_id, o.resource);
  IF moved IS NULL THEN
    RETURN NULL;
  END IF;
  -- In node order, as compute.bump_desired takes these rows.
  INSERT INTO compute.node_desired AS d (node_id, generation)
  SELECT u, 2 FROM unnest(moved) AS u ORDER BY u
  ON CONFLICT (node_id) DO UPDATE SET generation = d.generation + 1, updated_at = compute.compute_now();
  PERFORM pg_catalog.pg_notify('compute_desired', u::text) FROM unnest(moved) AS u;
  RETURN NULL;
END $$;
-- +goose StatementEnd
DROP TRIGGER bookings_desired_update ON compute.bookings;
CREATE TRIGGER bookings_desired_update AFTER UPDATE ON compute.bookings
  REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION compute.bump_desired_of_moved_bookings();

-- +goose Down
DROP TRIGGER bookings_desired_update ON compute.bookings;
CREATE TRIGGER bookings_desired_update AFTER UPDATE ON compute.bookings
  REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION compute.bump_desired();
DROP FUNCTION compute.bump_desired_of_moved_bookings();
