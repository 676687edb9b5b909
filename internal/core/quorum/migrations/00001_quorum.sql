-- The destructive-batch quorum (docs/fleet.md, "Destructive-batch quorum"). quorum_policies holds
-- each tenant's own policy; approvals the batches that were over one, bound to their call by
-- digest (SHA-256 of the method, the sorted targets and the canonical params); approval_votes the
-- answers of principals other than the one who asked. Only internal/quorum writes these tables.
-- An approval past expires_at reads as expired; nothing rewrites it.

-- +goose Up
CREATE TABLE compute.quorum_policies (
  tenant_id   text PRIMARY KEY,
  max_nodes   integer NOT NULL CHECK (max_nodes >= 0),
  max_percent integer NOT NULL CHECK (max_percent BETWEEN 0 AND 100),
  approvers   integer NOT NULL CHECK (approvers BETWEEN 1 AND 10),
  ttl         interval NOT NULL CHECK (ttl > interval '0'),
  updated_by  text NOT NULL,
  updated_at  timestamptz NOT NULL
);

CREATE TABLE compute.approvals (
  id           uuid PRIMARY KEY,
  tenant_id    text NOT NULL,
  method       text NOT NULL,
  digest       bytea NOT NULL CHECK (length(digest) = 32),
  targets      text[] NOT NULL,
  params       jsonb NOT NULL,
  reason       text NOT NULL,
  requested_by text NOT NULL,
  approvers    integer NOT NULL CHECK (approvers >= 1),
  state        text NOT NULL CHECK (state IN ('pending', 'approved', 'denied', 'consumed')),
  created_at   timestamptz NOT NULL,
  expires_at   timestamptz NOT NULL,
  consumed_at  timestamptz
);
CREATE INDEX approvals_tenant ON compute.approvals (tenant_id, id DESC);
-- The open approval of a caller's batch, found again when the caller asks again.
CREATE INDEX approvals_open ON compute.approvals (tenant_id, requested_by, digest) WHERE state IN ('pending', 'approved');

CREATE TABLE compute.approval_votes (
  approval_id uuid NOT NULL REFERENCES compute.approvals ON DELETE CASCADE,
  principal   text NOT NULL,
  approve     boolean NOT NULL,
  comment     text NOT NULL DEFAULT '',
  at          timestamptz NOT NULL,
  PRIMARY KEY (approval_id, principal)
);

-- +goose Down
DROP TABLE compute.approval_votes;
DROP TABLE compute.approvals;
DROP TABLE compute.quorum_policies;
