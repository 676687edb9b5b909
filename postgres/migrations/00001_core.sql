-- The foundation every other set builds on: the compute schema, its one clock and btree_gist,
-- which the EXCLUDE constraints of bookings need.

-- +goose Up
CREATE EXTENSION IF NOT EXISTS btree_gist WITH SCHEMA compute;

-- compute_now() is the one clock every statement reads. It is now() unless the session has set
-- compute.now (tests do, to travel in time).
CREATE FUNCTION compute.compute_now() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
  SELECT coalesce(nullif(pg_catalog.current_setting('compute.now', true), '')::timestamptz, pg_catalog.now())
$$;

-- A resource name: a DNS label.
CREATE DOMAIN compute.name AS text
  CHECK (VALUE ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$');

-- A label map: a JSON object of strings.
CREATE FUNCTION compute.valid_labels(l jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT pg_catalog.jsonb_typeof(l) = 'object'
     AND NOT EXISTS (SELECT 1 FROM pg_catalog.jsonb_each(l) e WHERE pg_catalog.jsonb_typeof(e.value) <> 'string')
$$;

-- +goose Down
DROP FUNCTION compute.valid_labels(jsonb);
DROP DOMAIN compute.name;
DROP FUNCTION compute.compute_now();
