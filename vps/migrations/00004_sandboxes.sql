-- Sandboxes: templates (what a sandbox is made from, how long it lives, how many wait warm),
-- the instances that are sandboxes or wait warm for one (a kind of instance), and snapshots of
-- instances (memory and disk, kept by their host).

-- +goose Up
CREATE TABLE compute.vps_sandbox_templates (
  id          uuid PRIMARY KEY,
  tenant_id   text NOT NULL,
  name        text NOT NULL,
  pool_id     uuid NOT NULL,
  flavor_id   uuid NOT NULL REFERENCES compute.vps_flavors (id),
  image_id    uuid NOT NULL REFERENCES compute.vps_images (id),
  env         jsonb NOT NULL DEFAULT '{}',
  network     text NOT NULL DEFAULT 'none',
  ttl         interval NOT NULL CHECK (ttl > '0'),
  max_ttl     interval NOT NULL CHECK (max_ttl >= ttl),
  warm        int NOT NULL DEFAULT 0 CHECK (warm BETWEEN 0 AND 64),
  warmup      interval NOT NULL DEFAULT '5 seconds',
  ready_line  text NOT NULL DEFAULT '' CHECK (length(ready_line) <= 256),
  created_by  text NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT compute.compute_now(),
  deleted_at  timestamptz
);
CREATE UNIQUE INDEX vps_sandbox_templates_name ON compute.vps_sandbox_templates (tenant_id, name) WHERE deleted_at IS NULL;

-- An instance is an instance, a sandbox, or warm: booted and paused, waiting in its template's
-- pool to become a sandbox.
ALTER TABLE compute.vps_instances
  ADD COLUMN kind text NOT NULL DEFAULT 'instance' CHECK (kind IN ('instance', 'sandbox', 'warm')),
  ADD COLUMN template_id uuid REFERENCES compute.vps_sandbox_templates (id),
  ADD COLUMN expires_at timestamptz,
  ADD COLUMN from_warm_pool boolean NOT NULL DEFAULT false,
  ADD COLUMN restore_snapshot uuid,
  ADD COLUMN restores int NOT NULL DEFAULT 0, -- a restore asked is one more; the host restores when it grows
  ADD COLUMN ready boolean NOT NULL DEFAULT false, -- a warm one's guest printed its template's ready line
  ADD COLUMN ssh_ca text NOT NULL DEFAULT '', -- a sandbox's (or warm one's): its tenant's SSH CA, which its guest trusts
  ADD CONSTRAINT vps_instances_sandbox CHECK ((kind = 'instance') = (template_id IS NULL)),
  ADD CONSTRAINT vps_instances_expires CHECK ((kind = 'sandbox') = (expires_at IS NOT NULL));
CREATE INDEX vps_instances_warm ON compute.vps_instances (template_id, created_at) WHERE kind = 'warm' AND deleted_at IS NULL;
CREATE INDEX vps_instances_expires ON compute.vps_instances (expires_at) WHERE kind = 'sandbox' AND deleted_at IS NULL;

CREATE TABLE compute.vps_snapshots (
  id            uuid PRIMARY KEY,
  tenant_id     text NOT NULL,
  name          text NOT NULL,
  instance_id   uuid NOT NULL REFERENCES compute.vps_instances (id),
  status        text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'ready', 'failed', 'deleted')),
  status_detail text NOT NULL DEFAULT '',
  created_by    text NOT NULL,
  created_at    timestamptz NOT NULL DEFAULT compute.compute_now(),
  deleted_at    timestamptz
);
CREATE UNIQUE INDEX vps_snapshots_name ON compute.vps_snapshots (instance_id, name) WHERE deleted_at IS NULL;

-- +goose Down
DROP TABLE compute.vps_snapshots;
ALTER TABLE compute.vps_instances DROP COLUMN kind, DROP COLUMN template_id, DROP COLUMN expires_at, DROP COLUMN from_warm_pool,
  DROP COLUMN restore_snapshot, DROP COLUMN restores, DROP COLUMN ready, DROP COLUMN ssh_ca;
DROP TABLE compute.vps_sandbox_templates;
