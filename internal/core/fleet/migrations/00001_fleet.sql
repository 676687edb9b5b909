-- The fleet: sites, pools and nodes (their devices and capacity belong to capacity). Every row belongs to one tenant, and a row
-- that refers to another (a pool's site, a node's pool) must belong to the same tenant: the
-- composite foreign keys on (id, tenant_id) make that a constraint, not a convention.

-- +goose Up
CREATE TABLE compute.sites (
  id           uuid PRIMARY KEY,
  tenant_id    text NOT NULL CHECK (tenant_id <> ''),
  name         compute.name NOT NULL,
  display_name text NOT NULL DEFAULT '' CHECK (length(display_name) <= 200),
  labels       jsonb NOT NULL DEFAULT '{}' CHECK (compute.valid_labels(labels)),
  created_at   timestamptz NOT NULL DEFAULT compute.compute_now(),
  updated_at   timestamptz NOT NULL DEFAULT compute.compute_now(),
  UNIQUE (tenant_id, name),
  UNIQUE (id, tenant_id)
);

CREATE TABLE compute.pools (
  id           uuid PRIMARY KEY,
  tenant_id    text NOT NULL CHECK (tenant_id <> ''),
  site_id      uuid,
  name         compute.name NOT NULL,
  display_name text NOT NULL DEFAULT '' CHECK (length(display_name) <= 200),
  description  text NOT NULL DEFAULT '' CHECK (length(description) <= 2000),
  labels       jsonb NOT NULL DEFAULT '{}' CHECK (compute.valid_labels(labels)),
  created_at   timestamptz NOT NULL DEFAULT compute.compute_now(),
  updated_at   timestamptz NOT NULL DEFAULT compute.compute_now(),
  UNIQUE (tenant_id, name),
  UNIQUE (id, tenant_id),
  FOREIGN KEY (site_id, tenant_id) REFERENCES compute.sites (id, tenant_id) ON DELETE RESTRICT
);
CREATE INDEX pools_site ON compute.pools (site_id) WHERE site_id IS NOT NULL;

CREATE TABLE compute.nodes (
  id           uuid PRIMARY KEY,
  tenant_id    text NOT NULL CHECK (tenant_id <> ''),
  pool_id      uuid NOT NULL,
  name         text NOT NULL CHECK (name ~ '^[A-Za-z0-9]([A-Za-z0-9._-]{0,251}[A-Za-z0-9])?$'),
  state        text NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'cordoned', 'draining', 'retired')),
  status       text NOT NULL DEFAULT 'offline' CHECK (status IN ('online', 'offline')),
  health       text NOT NULL DEFAULT 'unknown' CHECK (health IN ('unknown', 'healthy', 'degraded', 'unhealthy')),
  labels       jsonb NOT NULL DEFAULT '{}' CHECK (compute.valid_labels(labels)),
  facts        jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(facts) = 'object'),
  last_seen_at timestamptz,
  created_at   timestamptz NOT NULL DEFAULT compute.compute_now(),
  updated_at   timestamptz NOT NULL DEFAULT compute.compute_now(),
  UNIQUE (pool_id, name),
  UNIQUE (id, tenant_id),
  FOREIGN KEY (pool_id, tenant_id) REFERENCES compute.pools (id, tenant_id) ON DELETE RESTRICT
);
CREATE INDEX nodes_tenant ON compute.nodes (tenant_id, id);

-- +goose Down
DROP TABLE compute.nodes;
DROP TABLE compute.pools;
DROP TABLE compute.sites;
