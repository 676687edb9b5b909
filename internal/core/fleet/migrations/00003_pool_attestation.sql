-- A pool's attestation policy: what a machine's TPM must prove for it to join (docs/nodes.md,
-- "Attested joins"). tpm_ek_roots are PEM certificates of the CAs an EK certificate must chain
-- to; none means an EK is trusted on first use.

-- +goose Up
ALTER TABLE compute.pools
  ADD COLUMN tpm_attestation text NOT NULL DEFAULT 'off' CHECK (tpm_attestation IN ('off', 'optional', 'required')),
  ADD COLUMN tpm_ek_roots text[] NOT NULL DEFAULT '{}' CHECK (cardinality(tpm_ek_roots) <= 32);

-- +goose Down
ALTER TABLE compute.pools DROP COLUMN tpm_attestation, DROP COLUMN tpm_ek_roots;
