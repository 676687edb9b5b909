-- What a join token admits machines as: nodes, or site agents (bcd site) of the pool's site.

-- +goose Up
ALTER TABLE compute.join_tokens ADD COLUMN role text NOT NULL DEFAULT 'node' CHECK (role IN ('node', 'site'));

-- +goose Down
ALTER TABLE compute.join_tokens DROP COLUMN role;
