-- Billing: meters and an idempotent usage ledger.

-- +goose Up
CREATE TABLE iam.meters (
  key         text PRIMARY KEY CHECK (key ~ '^[a-z0-9_]+(\.[a-z0-9_]+)+$'),
  unit        text NOT NULL CHECK (length(unit) BETWEEN 1 AND 40),
  description text NOT NULL DEFAULT ''
);

CREATE TABLE iam.usage (
  id              text PRIMARY KEY,
  tenant_id       text NOT NULL REFERENCES iam.tenants (id) ON DELETE CASCADE,
  meter           text NOT NULL REFERENCES iam.meters (key),
  quantity        numeric NOT NULL CHECK (quantity >= 0),
  identity_id     text NOT NULL DEFAULT '',
  tags            jsonb NOT NULL DEFAULT '{}',
  occurred_at     timestamptz NOT NULL,
  idempotency_key text NOT NULL UNIQUE CHECK (length(idempotency_key) BETWEEN 1 AND 300),
  recorded_at     timestamptz NOT NULL DEFAULT compute.compute_now()
);
CREATE INDEX usage_tenant_meter ON iam.usage (tenant_id, meter, occurred_at);

-- +goose Down
DROP TABLE iam.usage;
DROP TABLE iam.meters;
