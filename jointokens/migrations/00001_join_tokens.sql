-- Join tokens: each admits up to max_uses machines into a pool until it expires or is revoked;
-- node_id scopes a takeover token to one node. Stored hashed. (IF NOT EXISTS: databases made
-- before this module owned the table have it from the nodes set's first migrations.)

-- +goose Up
CREATE TABLE IF NOT EXISTS compute.join_tokens (
  id          uuid PRIMARY KEY,
  tenant_id   text NOT NULL,
  pool_id     uuid NOT NULL,
  token_hash  bytea NOT NULL UNIQUE CHECK (length(token_hash) = 32),
  hint        text NOT NULL,
  description text NOT NULL DEFAULT '' CHECK (length(description) <= 2000),
  max_uses    integer NOT NULL CHECK (max_uses > 0),
  uses_left   integer NOT NULL CHECK (uses_left BETWEEN 0 AND max_uses),
  expires_at  timestamptz NOT NULL,
  revoked_at  timestamptz,
  created_by  text NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT compute.compute_now(),
  node_id     uuid REFERENCES compute.nodes (id) ON DELETE CASCADE,
  FOREIGN KEY (pool_id, tenant_id) REFERENCES compute.pools (id, tenant_id) ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS join_tokens_tenant ON compute.join_tokens (tenant_id, id);

-- +goose Down
DROP TABLE compute.join_tokens;
