-- A confirmation is of one call: the method, its canonical input (shown to the person) and their
-- hash, which the decision that spends it must match; and it expires. An event keeps the path of
-- its tenant as it was written, so that a caller sees only its own tenant's and descendants'
-- events, even of a tenant since deleted.

-- +goose Up
ALTER TABLE iam.confirmations
  ADD COLUMN method     text NOT NULL DEFAULT '',
  ADD COLUMN input      text NOT NULL DEFAULT 'null',
  ADD COLUMN input_hash text NOT NULL DEFAULT '',
  ADD COLUMN expires_at timestamptz NOT NULL DEFAULT compute.compute_now();
DROP INDEX iam.confirmations_open;
CREATE INDEX confirmations_open ON iam.confirmations (agent_id, tenant_id, action, resource, input_hash) WHERE state IN ('pending', 'approved');
ALTER TABLE iam.events ADD COLUMN tenant_path text[] NOT NULL DEFAULT '{}';

-- +goose Down
ALTER TABLE iam.events DROP COLUMN tenant_path;
DROP INDEX iam.confirmations_open;
CREATE INDEX confirmations_open ON iam.confirmations (agent_id, tenant_id, action, resource) WHERE state IN ('pending', 'approved');
ALTER TABLE iam.confirmations DROP COLUMN method, DROP COLUMN input, DROP COLUMN input_hash, DROP COLUMN expires_at;
