-- A command's result as its node signed it (agent/v1 Attested, serialized): kept beside the
-- result, so that who said what can be checked later with the node's certificate.

-- +goose Up
ALTER TABLE compute.commands ADD COLUMN attestation bytea;

-- +goose Down
ALTER TABLE compute.commands DROP COLUMN attestation;
