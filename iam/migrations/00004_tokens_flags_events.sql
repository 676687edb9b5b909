-- Tokens other than API keys (sessions, assumed roles, STS, delegations), feature flags with
-- per-tenant overrides, and the event feed (what changed, for caches and audit).

-- +goose Up
CREATE TABLE iam.tokens (
  id            text PRIMARY KEY,
  kind          text NOT NULL CHECK (kind IN ('ses', 'rol', 'sts', 'dlg')),
  token_hash    bytea NOT NULL UNIQUE CHECK (length(token_hash) = 32),
  identity_id   text NOT NULL REFERENCES iam.identities (id) ON DELETE CASCADE,
  role_id       text REFERENCES iam.roles (id) ON DELETE CASCADE,             -- rol: only this role
  delegation_id text REFERENCES iam.delegations (id) ON DELETE CASCADE,       -- dlg: acting under it
  expires_at    timestamptz NOT NULL,
  revoked_at    timestamptz,
  created_at    timestamptz NOT NULL DEFAULT compute.compute_now(),
  CHECK ((kind = 'rol') = (role_id IS NOT NULL)),
  CHECK ((kind = 'dlg') = (delegation_id IS NOT NULL))
);

CREATE TABLE iam.flags (
  key           text PRIMARY KEY CHECK (key ~ '^[a-z][a-z0-9._-]{0,127}$'),
  default_value boolean NOT NULL,
  description   text NOT NULL DEFAULT ''
);
CREATE TABLE iam.flag_overrides (
  key       text NOT NULL REFERENCES iam.flags (key) ON DELETE CASCADE,
  tenant_id text NOT NULL REFERENCES iam.tenants (id) ON DELETE CASCADE,
  value     boolean NOT NULL,
  PRIMARY KEY (key, tenant_id)
);

CREATE TABLE iam.events (
  id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  type       text NOT NULL,
  tenant_id  text NOT NULL,
  subject    text NOT NULL,
  data       jsonb NOT NULL DEFAULT '{}',
  created_at timestamptz NOT NULL DEFAULT compute.compute_now()
);

-- +goose Down
DROP TABLE iam.events;
DROP TABLE iam.flag_overrides;
DROP TABLE iam.flags;
DROP TABLE iam.tokens;
