-- Workflow runs and their steps. The workflow package alone writes them; each step's attempts
-- are a River job (compute.river_job), enqueued in the transaction that makes the step current
-- and completed in the one that records its success.

-- +goose Up
CREATE TABLE compute.workflow_runs (
  id          uuid PRIMARY KEY,
  workflow    text NOT NULL,
  tenant_id   text NOT NULL,
  subject     text NOT NULL DEFAULT '',
  state       text NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'succeeded', 'failed', 'cancelled')),
  input       jsonb NOT NULL DEFAULT '{}',
  step        int NOT NULL DEFAULT 0,  -- the current step's index
  job_id      bigint,                  -- the current step's River job
  error       text NOT NULL DEFAULT '',
  created_by  text NOT NULL DEFAULT '',
  created_at  timestamptz NOT NULL DEFAULT compute.compute_now(),
  finished_at timestamptz
);
CREATE INDEX workflow_runs_tenant ON compute.workflow_runs (tenant_id, id DESC);
CREATE INDEX workflow_runs_subject ON compute.workflow_runs (subject, id DESC);

CREATE TABLE compute.workflow_steps (
  run_id      uuid NOT NULL REFERENCES compute.workflow_runs ON DELETE CASCADE,
  n           int NOT NULL,
  name        text NOT NULL,
  state       text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'running', 'succeeded', 'failed', 'cancelled')),
  attempts    int NOT NULL DEFAULT 0,
  note        text NOT NULL DEFAULT '',
  error       text NOT NULL DEFAULT '',
  output      jsonb,
  started_at  timestamptz,
  finished_at timestamptz,
  PRIMARY KEY (run_id, n)
);

-- +goose Down
DROP TABLE compute.workflow_steps;
DROP TABLE compute.workflow_runs;
