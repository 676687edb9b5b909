-- The FleetConfig last applied to each tenant (docs/fleet.md): the document, who applied it and
-- when, the live state's fingerprint it left, and the drift the drift job last reported, so that
-- it tells of each change of drift once.

-- +goose Up
CREATE TABLE compute.fleet_configs (
  tenant_id        text PRIMARY KEY CHECK (tenant_id <> ''),
  document         jsonb NOT NULL,              -- api.FleetConfig, normalized; no secrets
  prune            boolean NOT NULL,
  fingerprint      text NOT NULL,               -- of the live state the apply left
  applied_by       text NOT NULL,
  applied_at       timestamptz NOT NULL,
  drift            jsonb NOT NULL DEFAULT '[]', -- the changes last reported (api.FleetChange)
  drift_hash       text NOT NULL DEFAULT '',    -- their hash; '' when there is no drift
  drift_checked_at timestamptz
);

-- +goose Down
DROP TABLE compute.fleet_configs;
