-- Delegated confirmation: a person delegates to an agent, listing the actions the agent may ask
-- for only with the person's confirmation. One approved confirmation allows one decision.

-- +goose Up
CREATE TABLE iam.delegations (
  id         text PRIMARY KEY,
  tenant_id  text NOT NULL REFERENCES iam.tenants (id) ON DELETE CASCADE,
  person_id  text NOT NULL,
  person_kind text NOT NULL DEFAULT 'user' CHECK (person_kind = 'user'),
  agent_id   text NOT NULL,
  agent_kind text NOT NULL DEFAULT 'agent' CHECK (agent_kind = 'agent'),
  confirm    text[] NOT NULL DEFAULT '{}',
  created_at timestamptz NOT NULL DEFAULT compute.compute_now(),
  revoked_at timestamptz,
  FOREIGN KEY (person_id, person_kind) REFERENCES iam.identities (id, kind) ON DELETE CASCADE,
  FOREIGN KEY (agent_id, agent_kind) REFERENCES iam.identities (id, kind) ON DELETE CASCADE
);
CREATE INDEX delegations_agent ON iam.delegations (agent_id) WHERE revoked_at IS NULL;

CREATE TABLE iam.confirmations (
  id            text PRIMARY KEY,
  delegation_id text NOT NULL REFERENCES iam.delegations (id) ON DELETE CASCADE,
  agent_id      text NOT NULL,
  tenant_id     text NOT NULL,
  action        text NOT NULL,
  resource      text NOT NULL,
  state         text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'approved', 'denied', 'consumed')),
  requested_at  timestamptz NOT NULL DEFAULT compute.compute_now(),
  decided_at    timestamptz,
  decided_by    text,
  consumed_at   timestamptz
);
CREATE INDEX confirmations_open ON iam.confirmations (agent_id, tenant_id, action, resource) WHERE state IN ('pending', 'approved');

-- +goose Down
DROP TABLE iam.confirmations;
DROP TABLE iam.delegations;
