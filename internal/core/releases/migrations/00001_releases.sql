-- bcd's release repository (The Update Framework): every version of each role's signed metadata,
-- the builds' bytes by SHA-256, and the releases the current targets list.

-- +goose Up
CREATE TABLE compute.release_metadata (
  role       text NOT NULL CHECK (role IN ('root', 'targets', 'snapshot', 'timestamp')),
  version    bigint NOT NULL CHECK (version > 0),
  body       bytea NOT NULL,
  expires_at timestamptz NOT NULL,
  created_by text NOT NULL DEFAULT '',
  created_at timestamptz NOT NULL DEFAULT compute.compute_now(),
  PRIMARY KEY (role, version)
);

-- A build's bytes, in chunks so that neither an upload nor a node's download holds it whole.
CREATE TABLE compute.release_blobs (
  sha256     text PRIMARY KEY CHECK (sha256 ~ '^[0-9a-f]{64}$'),
  length     bigint NOT NULL CHECK (length > 0),
  created_by text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT compute.compute_now()
);
CREATE TABLE compute.release_blob_chunks (
  sha256 text NOT NULL REFERENCES compute.release_blobs (sha256) ON DELETE CASCADE,
  n      integer NOT NULL CHECK (n >= 0),
  data   bytea NOT NULL,
  PRIMARY KEY (sha256, n)
);

-- The releases and builds the current targets metadata lists.
CREATE TABLE compute.releases (
  version         text PRIMARY KEY,
  targets_version bigint NOT NULL,
  published_by    text NOT NULL,
  published_at    timestamptz NOT NULL DEFAULT compute.compute_now()
);
CREATE TABLE compute.release_builds (
  target  text PRIMARY KEY,
  version text NOT NULL REFERENCES compute.releases (version) ON DELETE CASCADE,
  os      text NOT NULL,
  arch    text NOT NULL,
  sha256  text NOT NULL REFERENCES compute.release_blobs (sha256),
  length  bigint NOT NULL,
  UNIQUE (version, os, arch)
);
CREATE INDEX release_builds_sha256 ON compute.release_builds (sha256);

-- +goose Down
DROP TABLE compute.release_builds;
DROP TABLE compute.releases;
DROP TABLE compute.release_blob_chunks;
DROP TABLE compute.release_blobs;
DROP TABLE compute.release_metadata;
