-- The audit tree's signed checkpoints. Each row states that the Merkle tree of the events with
-- seq 1..size has root root, signed in note by the key verifier_key names. range_hashes is the
-- tree's compact range [0, size) (the roots of its perfect subtrees, left to right): the state
-- the publisher extends the tree from without reading older events again. Only the publisher
-- (internal/audit, under an advisory lock) writes here. The table is not trusted by verifiers:
-- checkpoints saved outside the database are what an edit here cannot reach.

-- +goose Up
CREATE TABLE compute.audit_checkpoints (
  size         bigint PRIMARY KEY CHECK (size > 0),
  root         bytea NOT NULL CHECK (length(root) = 32),
  range_hashes bytea[] NOT NULL,
  note         text NOT NULL,
  verifier_key text NOT NULL,
  created_at   timestamptz NOT NULL
);

-- +goose Down
DROP TABLE compute.audit_checkpoints;
