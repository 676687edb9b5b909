-- Provider pools: accounts at cloud providers (Hetzner Cloud, Proxmox VE) and the instances made
-- there with them. The vps module alone writes these tables; its River jobs create and delete
-- the servers, and its reconciler compares what each account lists with these rows.

-- +goose Up
CREATE TABLE compute.vps_provider_accounts (
  id              uuid PRIMARY KEY,
  tenant_id       text NOT NULL,
  name            text NOT NULL,
  kind            text NOT NULL,
  endpoint        text NOT NULL DEFAULT '' CHECK (length(endpoint) <= 2048),
  token           bytea NOT NULL, -- sealed (modules.SecretBox, purpose vps-provider-token:<id>); never answered
  options         jsonb NOT NULL DEFAULT '{}',
  flavors         jsonb NOT NULL DEFAULT '{}', -- flavor name → the provider's server type
  location        text NOT NULL DEFAULT '',
  max_instances   int NOT NULL DEFAULT 0 CHECK (max_instances >= 0),
  unknown_servers jsonb NOT NULL DEFAULT '[]', -- provider ids the last reconciliation matched to no instance
  reconciled_at   timestamptz,
  reconcile_error text NOT NULL DEFAULT '',
  created_by      text NOT NULL,
  created_at      timestamptz NOT NULL DEFAULT compute.compute_now(),
  UNIQUE (tenant_id, name)
);

CREATE TABLE compute.vps_provider_instances (
  id             uuid PRIMARY KEY,
  tenant_id      text NOT NULL,
  name           text NOT NULL,
  -- An account is removed only once none of its instances may still have a server; the rows
  -- keep its name and kind for the record.
  account_id     uuid REFERENCES compute.vps_provider_accounts (id) ON DELETE SET NULL,
  account_name   text NOT NULL,
  kind           text NOT NULL,
  -- The flavor as it was (no reference: a flavor may go while its instances are on record).
  flavor_id      uuid NOT NULL,
  flavor_name    text NOT NULL,
  vcpus          int NOT NULL,
  memory_gib     int NOT NULL,
  disk_gib       int NOT NULL,
  server_type    text NOT NULL DEFAULT '',
  image          text NOT NULL,
  location       text NOT NULL DEFAULT '',
  ssh_keys       text[] NOT NULL DEFAULT '{}',
  user_data      bytea, -- sealed (purpose vps-provider-userdata:<id>); NULL when none
  server_id      text NOT NULL DEFAULT '',
  server_at      timestamptz, -- when server_id was recorded: the reconciler calls lost only a server listed after it
  ipv4           text NOT NULL DEFAULT '',
  ipv6           text NOT NULL DEFAULT '',
  status         text NOT NULL DEFAULT 'pending'
                 CHECK (status IN ('pending', 'creating', 'running', 'stopped', 'other', 'error', 'lost', 'deleting', 'deleted')),
  status_detail  text NOT NULL DEFAULT '',
  status_at      timestamptz,
  deleted_at     timestamptz,
  deleted_reason text NOT NULL DEFAULT '',
  labels         jsonb NOT NULL DEFAULT '{}',
  created_by     text NOT NULL,
  created_at     timestamptz NOT NULL DEFAULT compute.compute_now(),
  CHECK ((deleted_at IS NULL) = (status NOT IN ('deleting', 'deleted')))
);
-- A live instance's name is its tenant's alone.
CREATE UNIQUE INDEX vps_provider_instances_name ON compute.vps_provider_instances (tenant_id, name) WHERE deleted_at IS NULL;
CREATE INDEX vps_provider_instances_account ON compute.vps_provider_instances (account_id) WHERE status <> 'deleted';

-- +goose Down
DROP TABLE compute.vps_provider_instances;
DROP TABLE compute.vps_provider_accounts;
