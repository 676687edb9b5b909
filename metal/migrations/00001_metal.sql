-- The metal module's tables, which it alone writes: the images machines are deployed with, and
-- the machines it reaches through their BMCs. A BMC password is stored sealed (AES-GCM under a
-- key derived from the secret, bound to its machine) and never returned.

-- +goose Up
CREATE TABLE compute.metal_images (
  id         uuid PRIMARY KEY,
  tenant_id  text NOT NULL,
  name       text NOT NULL,
  url        text NOT NULL CHECK (length(url) <= 2048),
  format     text NOT NULL CHECK (format IN ('raw', 'qcow2', 'tar')),
  size_bytes bigint NOT NULL CHECK (size_bytes > 0),
  sha256     text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
  created_by text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT compute.compute_now(),
  UNIQUE (tenant_id, name)
);

CREATE TABLE compute.metal_machines (
  id               uuid PRIMARY KEY,
  tenant_id        text NOT NULL,
  name             text NOT NULL,
  bmc_driver       text NOT NULL,
  bmc_address      text NOT NULL CHECK (length(bmc_address) <= 2048),
  bmc_username     text NOT NULL,
  bmc_password     bytea NOT NULL, -- sealed, purpose metal-bmc:<id>
  power            text NOT NULL DEFAULT 'unknown' CHECK (power IN ('unknown', 'on', 'off')),
  power_checked_at timestamptz,
  created_by       text NOT NULL,
  created_at       timestamptz NOT NULL DEFAULT compute.compute_now(),
  UNIQUE (tenant_id, name)
);

-- +goose Down
DROP TABLE compute.metal_machines;
DROP TABLE compute.metal_images;
