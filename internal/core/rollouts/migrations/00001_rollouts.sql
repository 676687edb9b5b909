-- Rollouts of bcd releases to pools, in waves, and the release each node is told to run (the
-- desired-state part bcd.release).

-- +goose Up
CREATE TABLE compute.rollouts (
  id                uuid PRIMARY KEY,
  tenant_id         text NOT NULL,
  pool_id           uuid NOT NULL,
  release           text NOT NULL,
  max_unavailable   integer NOT NULL CHECK (max_unavailable > 0),
  wave_deadline     interval NOT NULL,
  on_failure        text NOT NULL CHECK (on_failure IN ('pause', 'rollback')),
  state             text NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'paused', 'succeeded', 'rolling_back', 'rolled_back', 'failed')),
  wave              integer NOT NULL DEFAULT 0,
  -- The generation of the job that advances the rollout: a pause, a resume or a rollback moves
  -- it, and a job of an older generation stands down.
  generation        bigint NOT NULL DEFAULT 1,
  rollback_deadline timestamptz,
  note              text NOT NULL DEFAULT '',
  error             text NOT NULL DEFAULT '',
  created_by        text NOT NULL,
  created_at        timestamptz NOT NULL DEFAULT compute.compute_now(),
  updated_at        timestamptz NOT NULL DEFAULT compute.compute_now(),
  finished_at       timestamptz,
  FOREIGN KEY (pool_id, tenant_id) REFERENCES compute.pools (id, tenant_id) ON DELETE CASCADE
);
-- One unfinished rollout per pool: the index, not the code, refuses a second.
CREATE UNIQUE INDEX rollouts_open_per_pool ON compute.rollouts (pool_id) WHERE state IN ('running', 'paused', 'rolling_back');
CREATE INDEX rollouts_tenant ON compute.rollouts (tenant_id, id);

CREATE TABLE compute.rollout_waves (
  rollout_id  uuid NOT NULL REFERENCES compute.rollouts (id) ON DELETE CASCADE,
  n           integer NOT NULL CHECK (n > 0),
  state       text NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'succeeded', 'failed')),
  started_at  timestamptz NOT NULL,
  deadline    timestamptz NOT NULL,
  finished_at timestamptz,
  PRIMARY KEY (rollout_id, n)
);

CREATE TABLE compute.rollout_nodes (
  rollout_id       uuid NOT NULL REFERENCES compute.rollouts (id) ON DELETE CASCADE,
  node_id          uuid NOT NULL REFERENCES compute.nodes (id) ON DELETE CASCADE,
  wave             integer NOT NULL DEFAULT 0,
  state            text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'updating', 'updated', 'failed', 'reverting', 'reverted', 'skipped')),
  previous_version text NOT NULL DEFAULT '',
  attempts         integer NOT NULL DEFAULT 0,
  PRIMARY KEY (rollout_id, node_id)
);
CREATE INDEX rollout_nodes_wave ON compute.rollout_nodes (rollout_id, wave);

-- The release of bcd each node is told to run, and the try (rollout, attempt) it is part of.
CREATE TABLE compute.node_releases (
  node_id    uuid PRIMARY KEY REFERENCES compute.nodes (id) ON DELETE CASCADE,
  version    text NOT NULL,
  rollout_id uuid REFERENCES compute.rollouts (id) ON DELETE SET NULL,
  attempt    integer NOT NULL DEFAULT 1,
  updated_at timestamptz NOT NULL DEFAULT compute.compute_now()
);

-- +goose Down
DROP TABLE compute.node_releases;
DROP TABLE compute.rollout_nodes;
DROP TABLE compute.rollout_waves;
DROP TABLE compute.rollouts;
