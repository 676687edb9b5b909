-- Join requests: machines not known yet that appeared at a site (a PXE boot into the ramdisk,
-- which reports their facts) and wait for an operator to approve or reject them. One pending
-- request per machine serial: a machine that boots again updates its request.

-- +goose Up
CREATE TABLE compute.metal_join_requests (
  id         uuid PRIMARY KEY,
  tenant_id  text NOT NULL,
  site       text NOT NULL,
  serial     text NOT NULL,
  facts      jsonb NOT NULL,
  state      text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'approved', 'rejected')),
  machine_id uuid REFERENCES compute.metal_machines ON DELETE SET NULL,
  reason     text NOT NULL DEFAULT '',
  decided_by text NOT NULL DEFAULT '',
  decided_at timestamptz,
  seen_at    timestamptz NOT NULL DEFAULT compute.compute_now(),
  created_at timestamptz NOT NULL DEFAULT compute.compute_now()
);
CREATE UNIQUE INDEX metal_join_requests_pending ON compute.metal_join_requests (tenant_id, serial) WHERE state = 'pending';
CREATE INDEX metal_join_requests_tenant ON compute.metal_join_requests (tenant_id, id DESC);
ALTER TABLE compute.metal_machines ADD COLUMN facts jsonb NOT NULL DEFAULT '{}';

-- +goose Down
ALTER TABLE compute.metal_machines DROP COLUMN facts;
DROP TABLE compute.metal_join_requests;
