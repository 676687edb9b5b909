-- The machine PKI: the one identity Better Compute owns. The CA's private key is stored
-- encrypted with a key derived from Options.Secret; certificates are recorded so that revocation
-- takes effect on the next handshake.

-- +goose Up
CREATE TABLE compute.pki_authority (
  id            integer PRIMARY KEY CHECK (id = 1), -- one CA
  certificate   bytea NOT NULL,
  encrypted_key bytea NOT NULL,
  created_at    timestamptz NOT NULL DEFAULT compute.compute_now()
);

CREATE TABLE compute.certificates (
  serial     text PRIMARY KEY,
  kind       text NOT NULL CHECK (kind IN ('node', 'gateway')),
  subject    text NOT NULL, -- a node id, or the gateway's name
  not_after  timestamptz NOT NULL,
  revoked_at timestamptz,
  issued_at  timestamptz NOT NULL DEFAULT compute.compute_now()
);
CREATE INDEX certificates_subject ON compute.certificates (subject);

-- +goose Down
DROP TABLE compute.certificates;
DROP TABLE compute.pki_authority;
