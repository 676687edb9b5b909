-- The ping module's own tables: pings sent to nodes, and the banner each node should show.

-- +goose Up
CREATE TABLE compute.ping_pings (
  id         uuid PRIMARY KEY,
  tenant_id  text NOT NULL,
  node_id    uuid NOT NULL REFERENCES compute.nodes (id) ON DELETE CASCADE,
  message    text NOT NULL,
  command_id uuid NOT NULL,
  created_at timestamptz NOT NULL
);

CREATE TABLE compute.ping_banners (
  node_id   uuid PRIMARY KEY REFERENCES compute.nodes (id) ON DELETE CASCADE,
  tenant_id text NOT NULL,
  banner    text NOT NULL
);

-- +goose Down
DROP TABLE compute.ping_banners;
DROP TABLE compute.ping_pings;
