-- Taking over an existing node needs proof of being it: the hash of a takeover secret the node
-- keeps in its journal (sent in its CSR at first join), or a join token an operator scoped to
-- that one node (compute.join_tokens.node_id, in the jointokens module's set).

-- +goose Up
CREATE TABLE compute.node_takeover_secrets (
  node_id     uuid PRIMARY KEY REFERENCES compute.nodes (id) ON DELETE CASCADE,
  secret_hash bytea NOT NULL CHECK (length(secret_hash) = 32)
);

-- +goose Down
DROP TABLE compute.node_takeover_secrets;
