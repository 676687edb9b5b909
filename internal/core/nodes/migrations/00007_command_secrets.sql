-- A command's secret (commands.create's write-only "secret": a BMC password for a site agent),
-- sealed with a key derived from the control plane's secret and bound to the command. It is
-- opened only to be sent over the node's session, and erased when the command finishes.

-- +goose Up
ALTER TABLE compute.commands ADD COLUMN secret bytea;
ALTER TABLE compute.commands ADD CONSTRAINT commands_secret_open CHECK (secret IS NULL OR finished_at IS NULL);

-- +goose Down
ALTER TABLE compute.commands DROP COLUMN secret;
