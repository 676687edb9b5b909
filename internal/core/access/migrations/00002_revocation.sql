-- A certificate may be revoked before it expires (access.revoke); a revoked one, and one whose
-- reservation ended, is in the revocation list (KRL) the nodes' sshd reads.

-- +goose Up
ALTER TABLE compute.access_certificates
  ADD COLUMN revoked_at timestamptz,
  ADD COLUMN revoked_by text NOT NULL DEFAULT '';
CREATE INDEX access_certificates_valid ON compute.access_certificates (tenant_id, valid_before);

-- +goose Down
ALTER TABLE compute.access_certificates DROP COLUMN revoked_at, DROP COLUMN revoked_by;
