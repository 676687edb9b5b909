-- Idempotency keys of mutations: the first answer to (caller, method, key) is kept, so a retry
-- returns it instead of acting twice.

-- +goose Up
CREATE TABLE compute.idempotency_keys (
  principal_id text NOT NULL,
  method       text NOT NULL,
  key          text NOT NULL CHECK (length(key) BETWEEN 1 AND 200),
  request_hash bytea NOT NULL,
  response     bytea, -- the answer exactly as first sent
  created_at   timestamptz NOT NULL DEFAULT compute.compute_now(),
  PRIMARY KEY (principal_id, method, key)
);
CREATE INDEX idempotency_keys_created ON compute.idempotency_keys (created_at);

-- +goose Down
DROP TABLE compute.idempotency_keys;
