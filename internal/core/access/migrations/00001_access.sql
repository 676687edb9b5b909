-- SSH access: a certificate authority per tenant (its private key sealed, bound to the tenant)
-- and a record of every certificate it signed. The access package alone writes them.

-- +goose Up
CREATE TABLE compute.access_ssh_cas (
  tenant_id   text PRIMARY KEY,
  public_key  text NOT NULL,  -- authorized_keys form
  private_key bytea NOT NULL, -- sealed, purpose ssh-ca:<tenant>
  created_at  timestamptz NOT NULL DEFAULT compute.compute_now()
);

CREATE TABLE compute.access_certificates (
  serial         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  tenant_id      text NOT NULL,
  reservation_id uuid NOT NULL,
  key_id         text NOT NULL,
  principals     text[] NOT NULL,
  fingerprint    text NOT NULL, -- of the user's key, SHA256:…
  valid_after    timestamptz NOT NULL,
  valid_before   timestamptz NOT NULL,
  break_glass    boolean NOT NULL DEFAULT false,
  reason         text NOT NULL DEFAULT '',
  created_by     text NOT NULL,
  created_at     timestamptz NOT NULL DEFAULT compute.compute_now()
);
CREATE INDEX access_certificates_reservation ON compute.access_certificates (reservation_id);

-- +goose Down
DROP TABLE compute.access_certificates;
DROP TABLE compute.access_ssh_cas;
