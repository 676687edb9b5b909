-- Tenants sharing a node: a ticket records whether its tunnel runs as root (a holder of the
-- whole node, or an operator) or as the reservation's own user, and break-glass with its reason.

-- +goose Up
ALTER TABLE compute.access_tickets
  ADD COLUMN root        boolean NOT NULL DEFAULT false,
  ADD COLUMN break_glass boolean NOT NULL DEFAULT false,
  ADD COLUMN reason      text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE compute.access_tickets DROP COLUMN root, DROP COLUMN break_glass, DROP COLUMN reason;
