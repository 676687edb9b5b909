-- Machines at sites, deployed and released: each machine may belong to a site, whose agent (bcd
-- site) reaches its BMC and boots it; its MACs tell the site which machine PXE-boots; its
-- profile composes its drivers; its boot and task are its part of its site's plan. The progress
-- a machine's ramdisk reports, and each site's image cache, are recorded as the site reports
-- them. A deploy's join credential lets the deployed system join its pool once. A lease books a
-- whole machine for a holder (dedicated root), guarded as bookings are: never two at once.

-- +goose Up
-- An image may carry the kernel and initramfs to boot it with, in place, from the ramdisk (kexec).
ALTER TABLE compute.metal_images
  ADD COLUMN kernel_url text NOT NULL DEFAULT '' CHECK (length(kernel_url) <= 2048),
  ADD COLUMN initrd_url text NOT NULL DEFAULT '' CHECK (length(initrd_url) <= 2048),
  ADD COLUMN cmdline text NOT NULL DEFAULT '' CHECK (length(cmdline) <= 1024),
  ADD COLUMN pull_token bytea; -- sealed, purpose metal-image:<id>: write-only
ALTER TABLE compute.metal_machines
  ADD COLUMN site_id uuid REFERENCES compute.sites ON DELETE RESTRICT,
  ADD COLUMN profile text NOT NULL DEFAULT '',
  ADD COLUMN state text NOT NULL DEFAULT 'available' CHECK (state IN ('available', 'deploying', 'deployed', 'releasing', 'failed')),
  ADD COLUMN boot text NOT NULL DEFAULT 'disk' CHECK (boot IN ('disk', 'ramdisk')),
  ADD COLUMN task jsonb CHECK (task IS NULL OR jsonb_typeof(task) = 'object'),
  ADD COLUMN token text NOT NULL DEFAULT '',
  ADD COLUMN image_id uuid REFERENCES compute.metal_images ON DELETE RESTRICT,
  ADD COLUMN node_id uuid,
  ADD COLUMN seen_at timestamptz,
  ADD COLUMN state_changed_at timestamptz NOT NULL DEFAULT compute.compute_now();
CREATE INDEX metal_machines_site ON compute.metal_machines (site_id) WHERE site_id IS NOT NULL;

-- A MAC is one machine's, whichever tenant.
CREATE TABLE compute.metal_macs (
  mac        text PRIMARY KEY CHECK (mac ~ '^([0-9a-f]{2}:){5}[0-9a-f]{2}$'),
  machine_id uuid NOT NULL REFERENCES compute.metal_machines ON DELETE CASCADE
);
CREATE INDEX metal_macs_machine ON compute.metal_macs (machine_id);

-- The last progress of each task, as its ramdisk posted it.
CREATE TABLE compute.metal_task_progress (
  task_id    text PRIMARY KEY,
  machine_id uuid NOT NULL REFERENCES compute.metal_machines ON DELETE CASCADE,
  phase      text NOT NULL,
  bytes      bigint NOT NULL DEFAULT 0,
  total      bigint NOT NULL DEFAULT 0,
  error      text NOT NULL DEFAULT '',
  updated_at timestamptz NOT NULL DEFAULT compute.compute_now()
);

-- Each site's cache of the images its plan names.
CREATE TABLE compute.metal_site_images (
  site_id    uuid NOT NULL REFERENCES compute.sites ON DELETE CASCADE,
  sha256     text NOT NULL,
  state      text NOT NULL CHECK (state IN ('cached', 'failed')),
  error      text NOT NULL DEFAULT '',
  updated_at timestamptz NOT NULL DEFAULT compute.compute_now(),
  PRIMARY KEY (site_id, sha256)
);

-- What a deployed system joins its pool with: one use, for the deploy's machine, hashed.
CREATE TABLE compute.metal_deploy_tokens (
  token_hash bytea PRIMARY KEY CHECK (length(token_hash) = 32),
  machine_id uuid NOT NULL REFERENCES compute.metal_machines ON DELETE CASCADE,
  tenant_id  text NOT NULL,
  pool_id    uuid NOT NULL,
  run_id     text NOT NULL, -- the deploy's workflow run
  takeover_node uuid,       -- the node of the pool this machine was, which the system takes over
  expires_at timestamptz NOT NULL,
  used_at    timestamptz
);
CREATE INDEX metal_deploy_tokens_machine ON compute.metal_deploy_tokens (machine_id);

-- Dedicated-root leases: a whole machine for a holder, deployed with the holder's image and keys.
CREATE TABLE compute.metal_leases (
  id         uuid PRIMARY KEY,
  tenant_id  text NOT NULL,
  machine_id uuid NOT NULL REFERENCES compute.metal_machines ON DELETE RESTRICT,
  holder     text NOT NULL,
  image_id   uuid NOT NULL REFERENCES compute.metal_images ON DELETE RESTRICT,
  ssh_keys   text[] NOT NULL DEFAULT '{}',
  during     tstzrange NOT NULL CHECK (NOT isempty(during) AND lower(during) IS NOT NULL AND upper(during) IS NOT NULL),
  state      text NOT NULL DEFAULT 'deploying' CHECK (state IN ('deploying', 'ready', 'releasing', 'ended', 'failed')),
  run_id     text NOT NULL DEFAULT '',
  error      text NOT NULL DEFAULT '',
  created_at timestamptz NOT NULL DEFAULT compute.compute_now(),
  ended_at   timestamptz,
  -- A machine is never leased twice at once: the database refuses the second (23P01).
  EXCLUDE USING gist (machine_id WITH =, during WITH &&)
);
CREATE INDEX metal_leases_tenant ON compute.metal_leases (tenant_id, id DESC);
CREATE INDEX metal_leases_open ON compute.metal_leases (upper(during)) WHERE state IN ('deploying', 'ready');

-- The commands a workflow step's attempt queued for a site agent (metal.bmc), so that the step,
-- run again, finds its command rather than queueing another.
CREATE TABLE compute.metal_step_commands (
  run_id     text NOT NULL,
  step       text NOT NULL,
  attempt    integer NOT NULL,
  command_id uuid NOT NULL,
  PRIMARY KEY (run_id, step, attempt)
);

-- +goose Down
DROP TABLE compute.metal_step_commands;
DROP TABLE compute.metal_leases;
DROP TABLE compute.metal_deploy_tokens;
DROP TABLE compute.metal_site_images;
DROP TABLE compute.metal_task_progress;
DROP TABLE compute.metal_macs;
ALTER TABLE compute.metal_images DROP COLUMN kernel_url, DROP COLUMN initrd_url, DROP COLUMN cmdline, DROP COLUMN pull_token;
ALTER TABLE compute.metal_machines DROP COLUMN site_id, DROP COLUMN profile, DROP COLUMN state, DROP COLUMN boot, DROP COLUMN task,
  DROP COLUMN token, DROP COLUMN image_id, DROP COLUMN node_id, DROP COLUMN seen_at, DROP COLUMN state_changed_at;
