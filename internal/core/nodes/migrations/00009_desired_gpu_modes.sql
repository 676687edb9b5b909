-- A node's desired state carries its GPUs' modes (whole, MIG, time-sliced): a GPU added or gone,
-- or a change of its mode (devices.setMode) or its UUID, moves its node's generation, as a change
-- of its bookings does. An inventory that only refreshes a GPU's health moves nothing.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION compute.bump_desired_of_modes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO compute.node_desired AS d (node_id, generation)
  SELECT DISTINCT n.node_id, 2 FROM new_devices n JOIN old_devices o USING (id)
  WHERE (n.mode, n.shares, n.uuid) IS DISTINCT FROM (o.mode, o.shares, o.uuid) ORDER BY n.node_id
  ON CONFLICT (node_id) DO UPDATE SET generation = d.generation + 1, updated_at = compute.compute_now();
  PERFORM pg_catalog.pg_notify('compute_desired', x.node_id::text)
  FROM (SELECT DISTINCT n.node_id FROM new_devices n JOIN old_devices o USING (id)
        WHERE (n.mode, n.shares, n.uuid) IS DISTINCT FROM (o.mode, o.shares, o.uuid)) x;
  RETURN NULL;
END $$;
-- +goose StatementEnd
CREATE TRIGGER devices_desired_modes AFTER UPDATE ON compute.devices
  REFERENCING OLD TABLE AS old_devices NEW TABLE AS new_devices FOR EACH STATEMENT EXECUTE FUNCTION compute.bump_desired_of_modes();
CREATE TRIGGER devices_desired_insert AFTER INSERT ON compute.devices
  REFERENCING NEW TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION compute.bump_desired();
CREATE TRIGGER devices_desired_delete AFTER DELETE ON compute.devices
  REFERENCING OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION compute.bump_desired();

-- +goose Down
DROP TRIGGER devices_desired_delete ON compute.devices;
DROP TRIGGER devices_desired_insert ON compute.devices;
DROP TRIGGER devices_desired_modes ON compute.devices;
DROP FUNCTION compute.bump_desired_of_modes();
