-- Networks a tenant's instances attach to, and the addresses handed out on them (IPAM). EXCLUDE
-- constraints are the referees, as they are for bookings: a tenant's networks never overlap, a
-- host bridge carries one VLAN, and an address of a network is never leased twice, however many
-- instance creates race for it.

-- +goose Up
CREATE TABLE compute.vps_networks (
  id             uuid PRIMARY KEY,
  tenant_id      text NOT NULL,
  name           text NOT NULL,
  cidr           cidr NOT NULL CHECK (family(cidr) = 4 AND masklen(cidr) BETWEEN 8 AND 30),
  gateway        inet NOT NULL CHECK (family(gateway) = 4 AND masklen(gateway) = 32),
  cidr6          cidr CHECK (family(cidr6) = 6 AND masklen(cidr6) BETWEEN 48 AND 126),
  gateway6       inet CHECK (family(gateway6) = 6 AND masklen(gateway6) = 128),
  dns            inet[] NOT NULL DEFAULT '{}',
  vlan           int CHECK (vlan BETWEEN 1 AND 4094), -- NULL: untagged
  bridge         text NOT NULL CHECK (bridge ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$'),
  -- Addresses kept for static use: the allocator never picks them; a static request may.
  reserved_first inet CHECK (masklen(reserved_first) = 32),
  reserved_last  inet CHECK (masklen(reserved_last) = 32),
  created_by     text NOT NULL,
  created_at     timestamptz NOT NULL DEFAULT compute.compute_now(),
  UNIQUE (tenant_id, name),
  CHECK (gateway << cidr AND host(gateway) <> host(cidr) AND host(gateway) <> host(broadcast(cidr))),
  CHECK ((cidr6 IS NULL) = (gateway6 IS NULL)),
  CHECK (gateway6 IS NULL OR gateway6 << cidr6 OR gateway6 << 'fe80::/10'),
  CHECK ((reserved_first IS NULL) = (reserved_last IS NULL)),
  CHECK (reserved_first IS NULL OR (reserved_first << cidr AND reserved_last << cidr AND reserved_first <= reserved_last)),
  -- A tenant's networks never overlap: an address names one of its NICs.
  CONSTRAINT vps_networks_tenant_overlap EXCLUDE USING gist (tenant_id WITH =, cidr inet_ops WITH &&),
  CONSTRAINT vps_networks_tenant_overlap6 EXCLUDE USING gist (tenant_id WITH =, cidr6 inet_ops WITH &&),
  -- One segment (a bridge with its VLAN) has one IPAM: two networks on it, any tenants', may
  -- not overlap, or both would hand out one address on one wire.
  CONSTRAINT vps_networks_segment_overlap EXCLUDE USING gist (bridge WITH =, (coalesce(vlan, 0)) WITH =, cidr inet_ops WITH &&),
  -- A host bridge carries one VLAN (its port is that VLAN's sub-interface of the uplink).
  CONSTRAINT vps_networks_bridge_vlan EXCLUDE USING gist (bridge WITH =, (coalesce(vlan, 0)) WITH <>)
);

-- An address lease: a NIC of an instance on a network, with its IPv4 (and IPv6) address. A row
-- is deleted when its instance is; the addresses are then free again.
CREATE TABLE compute.vps_addresses (
  network_id  uuid NOT NULL REFERENCES compute.vps_networks (id),
  -- Deferred: an instance's create may lease its addresses before it writes its row.
  instance_id uuid NOT NULL REFERENCES compute.vps_instances (id) DEFERRABLE INITIALLY DEFERRED,
  nic         int NOT NULL CHECK (nic BETWEEN 0 AND 7),
  mac         macaddr NOT NULL,
  address     inet NOT NULL CHECK (family(address) = 4 AND masklen(address) = 32),
  address6    inet CHECK (family(address6) = 6 AND masklen(address6) = 128),
  static      boolean NOT NULL DEFAULT false,
  created_at  timestamptz NOT NULL DEFAULT compute.compute_now(),
  PRIMARY KEY (instance_id, nic),
  UNIQUE (instance_id, network_id),
  -- The referees: an address of a network is never leased twice.
  CONSTRAINT vps_addresses_once EXCLUDE USING gist (network_id WITH =, address inet_ops WITH &&),
  CONSTRAINT vps_addresses_once6 EXCLUDE USING gist (network_id WITH =, address6 inet_ops WITH &&)
);
-- In address order, for the allocator's walk to the first gap and for networks.addresses.
CREATE INDEX vps_addresses_order ON compute.vps_addresses (network_id, address);
CREATE INDEX vps_addresses_order6 ON compute.vps_addresses (network_id, address6) WHERE address6 IS NOT NULL;

-- +goose Down
DROP TABLE compute.vps_addresses;
DROP TABLE compute.vps_networks;
