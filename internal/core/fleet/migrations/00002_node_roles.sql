-- A node's role: what the machine joined as. A site agent (bcd site) is a node of role 'site' in
-- a pool of its site: it holds a session like any node but offers no capacity.

-- +goose Up
ALTER TABLE compute.nodes ADD COLUMN role text NOT NULL DEFAULT 'node' CHECK (role IN ('node', 'site'));
CREATE INDEX nodes_site_agents ON compute.nodes (pool_id) WHERE role = 'site';

-- +goose Down
ALTER TABLE compute.nodes DROP COLUMN role;
