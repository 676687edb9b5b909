-- The referees' own indexes (docs/capacity.md, "The referee's own index"): PostgreSQL's GiST scans
-- that a statement rescans can mark a live entry dead, and an exclusion check then skips it. The
-- allocator's walk to the first free address rescans a lookup of vps_addresses per candidate,
-- which could use vps_addresses_once, and so hand one address out twice. Each exclusion
-- constraint's index is made one no query can use: partial, on a column every row has true and
-- no query names. Reads use the btree indexes (vps_addresses_order, the keys of vps_networks).

-- +goose Up
ALTER TABLE compute.vps_networks ADD COLUMN guarded boolean NOT NULL DEFAULT true CHECK (guarded);
-- The constraint is dropped and added again, same name and meaning, in one statement (one lock):
-- nothing a release of the window uses goes away (TestUpgradeInPlace runs N-2 on it).
-- compat: contract
ALTER TABLE compute.vps_networks
  DROP CONSTRAINT vps_networks_tenant_overlap,
  ADD CONSTRAINT vps_networks_tenant_overlap EXCLUDE USING gist (tenant_id WITH =, cidr inet_ops WITH &&) WHERE (guarded),
  DROP CONSTRAINT vps_networks_tenant_overlap6,
  ADD CONSTRAINT vps_networks_tenant_overlap6 EXCLUDE USING gist (tenant_id WITH =, cidr6 inet_ops WITH &&) WHERE (guarded),
  DROP CONSTRAINT vps_networks_segment_overlap,
  ADD CONSTRAINT vps_networks_segment_overlap EXCLUDE USING gist (bridge WITH =, (coalesce(vlan, 0)) WITH =, cidr inet_ops WITH &&) WHERE (guarded),
  DROP CONSTRAINT vps_networks_bridge_vlan,
  ADD CONSTRAINT vps_networks_bridge_vlan EXCLUDE USING gist (bridge WITH =, (coalesce(vlan, 0)) WITH <>) WHERE (guarded);
ALTER TABLE compute.vps_addresses ADD COLUMN guarded boolean NOT NULL DEFAULT true CHECK (guarded);
-- compat: contract
ALTER TABLE compute.vps_addresses
  DROP CONSTRAINT vps_addresses_once,
  ADD CONSTRAINT vps_addresses_once EXCLUDE USING gist (network_id WITH =, address inet_ops WITH &&) WHERE (guarded),
  DROP CONSTRAINT vps_addresses_once6,
  ADD CONSTRAINT vps_addresses_once6 EXCLUDE USING gist (network_id WITH =, address6 inet_ops WITH &&) WHERE (guarded);

-- +goose Down
ALTER TABLE compute.vps_addresses
  DROP CONSTRAINT vps_addresses_once,
  ADD CONSTRAINT vps_addresses_once EXCLUDE USING gist (network_id WITH =, address inet_ops WITH &&),
  DROP CONSTRAINT vps_addresses_once6,
  ADD CONSTRAINT vps_addresses_once6 EXCLUDE USING gist (network_id WITH =, address6 inet_ops WITH &&);
ALTER TABLE compute.vps_addresses DROP COLUMN guarded;
ALTER TABLE compute.vps_networks
  DROP CONSTRAINT vps_networks_tenant_overlap,
  ADD CONSTRAINT vps_networks_tenant_overlap EXCLUDE USING gist (tenant_id WITH =, cidr inet_ops WITH &&),
  DROP CONSTRAINT vps_networks_tenant_overlap6,
  ADD CONSTRAINT vps_networks_tenant_overlap6 EXCLUDE USING gist (tenant_id WITH =, cidr6 inet_ops WITH &&),
  DROP CONSTRAINT vps_networks_segment_overlap,
  ADD CONSTRAINT vps_networks_segment_overlap EXCLUDE USING gist (bridge WITH =, (coalesce(vlan, 0)) WITH =, cidr inet_ops WITH &&),
  DROP CONSTRAINT vps_networks_bridge_vlan,
  ADD CONSTRAINT vps_networks_bridge_vlan EXCLUDE USING gist (bridge WITH =, (coalesce(vlan, 0)) WITH <>);
ALTER TABLE compute.vps_networks DROP COLUMN guarded;
