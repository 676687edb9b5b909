-- Command kinds are registered by modules (modules.Registry.CommandKind) and checked when a
-- command is queued; the table keeps only their form.

-- +goose Up
ALTER TABLE compute.commands DROP CONSTRAINT commands_kind_check;
ALTER TABLE compute.commands ADD CONSTRAINT commands_kind_check CHECK (kind ~ '^[a-z][a-z0-9]*(\.[a-z][a-z0-9]*)+$');

-- +goose Down
ALTER TABLE compute.commands DROP CONSTRAINT commands_kind_check;
ALTER TABLE compute.commands ADD CONSTRAINT commands_kind_check CHECK (kind IN ('inventory.refresh', 'gpu.reset', 'health.check', 'diag.run'));
