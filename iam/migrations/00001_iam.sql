-- The embedded Better IAM: tenants, identities, API keys, roles and their bindings, and the
-- catalog of resource types and actions that applications contribute.

-- +goose Up
CREATE TABLE iam.tenants (
  id         text PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$'),
  parent_id  text REFERENCES iam.tenants (id) ON DELETE RESTRICT,
  kind       text NOT NULL CHECK (kind IN ('root', 'organization', 'project')),
  name       text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
  created_at timestamptz NOT NULL DEFAULT compute.compute_now(),
  CHECK ((kind = 'root') = (parent_id IS NULL)),
  CHECK (parent_id IS DISTINCT FROM id)
);
-- One root per deployment.
CREATE UNIQUE INDEX tenants_one_root ON iam.tenants ((true)) WHERE kind = 'root';
CREATE INDEX tenants_parent ON iam.tenants (parent_id);

CREATE TABLE iam.identities (
  id         text PRIMARY KEY,
  tenant_id  text NOT NULL REFERENCES iam.tenants (id) ON DELETE CASCADE,
  kind       text NOT NULL CHECK (kind IN ('user', 'service', 'agent')),
  name       text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
  created_at timestamptz NOT NULL DEFAULT compute.compute_now(),
  UNIQUE (tenant_id, name),
  UNIQUE (id, kind)
);

CREATE TABLE iam.api_keys (
  id            text PRIMARY KEY,
  identity_id   text NOT NULL,
  identity_kind text NOT NULL CHECK (identity_kind IN ('service', 'agent')), -- never a user
  name          text NOT NULL DEFAULT '' CHECK (length(name) <= 200),
  token_hash    bytea NOT NULL UNIQUE CHECK (length(token_hash) = 32),
  hint          text NOT NULL, -- the last characters, to tell keys apart
  expires_at    timestamptz,
  revoked_at    timestamptz,
  created_at    timestamptz NOT NULL DEFAULT compute.compute_now(),
  FOREIGN KEY (identity_id, identity_kind) REFERENCES iam.identities (id, kind) ON DELETE CASCADE
);
CREATE INDEX api_keys_identity ON iam.api_keys (identity_id);

CREATE TABLE iam.roles (
  id         text PRIMARY KEY,
  tenant_id  text NOT NULL REFERENCES iam.tenants (id) ON DELETE CASCADE,
  name       text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
  policy     jsonb NOT NULL CHECK (jsonb_typeof(policy) = 'object'),
  created_at timestamptz NOT NULL DEFAULT compute.compute_now(),
  UNIQUE (tenant_id, name)
);

-- A binding gives an identity a role in a tenant and all the tenant's descendants.
CREATE TABLE iam.bindings (
  id          text PRIMARY KEY,
  identity_id text NOT NULL REFERENCES iam.identities (id) ON DELETE CASCADE,
  role_id     text NOT NULL REFERENCES iam.roles (id) ON DELETE CASCADE,
  tenant_id   text NOT NULL REFERENCES iam.tenants (id) ON DELETE CASCADE,
  created_at  timestamptz NOT NULL DEFAULT compute.compute_now(),
  UNIQUE (identity_id, role_id, tenant_id)
);

CREATE TABLE iam.resource_types (
  name        text PRIMARY KEY CHECK (name ~ '^[a-z][a-z0-9-]{0,62}$'),
  description text NOT NULL DEFAULT ''
);

CREATE TABLE iam.actions (
  name          text PRIMARY KEY CHECK (name ~ '^[a-z][a-z0-9-]*(:[a-zA-Z0-9*-]+)+$'),
  resource_type text NOT NULL REFERENCES iam.resource_types (name),
  description   text NOT NULL DEFAULT ''
);

-- +goose Down
DROP TABLE iam.actions;
DROP TABLE iam.resource_types;
DROP TABLE iam.bindings;
DROP TABLE iam.roles;
DROP TABLE iam.api_keys;
DROP TABLE iam.identities;
DROP TABLE iam.tenants;
