-- Whether a VM host reaches its runtime, as its bcd last said (vps.host): one that does not is
-- no place for VMs, and the work booked on it is given up after a grace (docs/vps.md, "When a
-- host's runtime does not answer").

-- +goose Up
ALTER TABLE compute.vps_hosts
  ADD COLUMN unreachable       text NOT NULL DEFAULT '' CHECK (length(unreachable) <= 1024),
  ADD COLUMN unreachable_since timestamptz,
  ADD CONSTRAINT vps_hosts_unreachable_since CHECK ((unreachable = '') = (unreachable_since IS NULL));
CREATE INDEX vps_hosts_unreachable ON compute.vps_hosts (node_id) WHERE unreachable <> '';

-- +goose Down
DROP INDEX compute.vps_hosts_unreachable;
ALTER TABLE compute.vps_hosts DROP CONSTRAINT vps_hosts_unreachable_since, DROP COLUMN unreachable_since, DROP COLUMN unreachable;
