-- The vps module's tables, which it alone writes: flavors (shapes of instances), images (what
-- they boot), instances (each holding its capacity through a reservation: the bookings' EXCLUDE
-- constraint is what keeps a vCPU or GPU from two holders, an instance's or anyone's), and the
-- hosts that run them (the nodes whose bcd reports a VM runtime).

-- +goose Up
CREATE TABLE compute.vps_flavors (
  id             uuid PRIMARY KEY,
  tenant_id      text NOT NULL,
  name           text NOT NULL,
  vcpus          int NOT NULL CHECK (vcpus > 0),
  memory_gib     int NOT NULL CHECK (memory_gib > 0),
  disk_gib       int NOT NULL DEFAULT 0 CHECK (disk_gib >= 0),
  gpus           int NOT NULL DEFAULT 0 CHECK (gpus >= 0),
  gpu_model      text NOT NULL DEFAULT '',
  mig_profile    text NOT NULL DEFAULT '',
  require_labels jsonb NOT NULL DEFAULT '{}',
  created_by     text NOT NULL,
  created_at     timestamptz NOT NULL DEFAULT compute.compute_now(),
  deleted_at     timestamptz -- removed from use; kept for the instances that had it
);
CREATE UNIQUE INDEX vps_flavors_name ON compute.vps_flavors (tenant_id, name) WHERE deleted_at IS NULL;

CREATE TABLE compute.vps_images (
  id             uuid PRIMARY KEY,
  tenant_id      text NOT NULL,
  name           text NOT NULL,
  kernel_url     text NOT NULL DEFAULT '' CHECK (length(kernel_url) <= 2048),
  kernel_sha256  text NOT NULL DEFAULT '' CHECK (kernel_sha256 ~ '^([0-9a-f]{64})?$'),
  initrd_url     text NOT NULL DEFAULT '' CHECK (length(initrd_url) <= 2048),
  initrd_sha256  text NOT NULL DEFAULT '' CHECK (initrd_sha256 ~ '^([0-9a-f]{64})?$'),
  cmdline        text NOT NULL DEFAULT '' CHECK (length(cmdline) <= 4096),
  disk_url       text NOT NULL DEFAULT '' CHECK (length(disk_url) <= 2048),
  disk_sha256    text NOT NULL DEFAULT '' CHECK (disk_sha256 ~ '^([0-9a-f]{64})?$'),
  created_by     text NOT NULL,
  created_at     timestamptz NOT NULL DEFAULT compute.compute_now(),
  deleted_at     timestamptz, -- removed from use; kept for the instances that had it
  CHECK (kernel_url <> '' OR disk_url <> '')
);
CREATE UNIQUE INDEX vps_images_name ON compute.vps_images (tenant_id, name) WHERE deleted_at IS NULL;

-- The nodes that run VMs, as their bcd reported (vps.host).
CREATE TABLE compute.vps_hosts (
  node_id     uuid PRIMARY KEY,
  runtime     text NOT NULL,
  reported_at timestamptz NOT NULL DEFAULT compute.compute_now()
);

CREATE TABLE compute.vps_instances (
  id             uuid PRIMARY KEY,
  tenant_id      text NOT NULL,
  name           text NOT NULL,
  flavor_id      uuid NOT NULL REFERENCES compute.vps_flavors (id),
  image_id       uuid NOT NULL REFERENCES compute.vps_images (id),
  reservation_id uuid NOT NULL,
  node_id        uuid NOT NULL,
  -- What it should be (power) and what its host last said it is (status).
  power          text NOT NULL CHECK (power IN ('running', 'paused', 'stopped')),
  reboots        int NOT NULL DEFAULT 0, -- a reboot asked is one more; the host reboots when it grows
  status         text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'running', 'paused', 'stopped', 'error', 'deleted')),
  status_detail  text NOT NULL DEFAULT '',
  status_at      timestamptz,
  deleted_at     timestamptz,
  deleted_reason text NOT NULL DEFAULT '',
  labels         jsonb NOT NULL DEFAULT '{}',
  created_by     text NOT NULL,
  created_at     timestamptz NOT NULL DEFAULT compute.compute_now()
);
-- A live instance's name is its tenant's alone.
CREATE UNIQUE INDEX vps_instances_name ON compute.vps_instances (tenant_id, name) WHERE deleted_at IS NULL;
CREATE INDEX vps_instances_node ON compute.vps_instances (node_id) WHERE deleted_at IS NULL;
CREATE INDEX vps_instances_reservation ON compute.vps_instances (reservation_id);

-- +goose Down
DROP TABLE compute.vps_instances;
DROP TABLE compute.vps_hosts;
DROP TABLE compute.vps_images;
DROP TABLE compute.vps_flavors;
