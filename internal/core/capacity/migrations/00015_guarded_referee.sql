-- The referee's own index (docs/capacity.md, "The referee's own index"). PostgreSQL's GiST scans
-- that a statement rescans (the inner side of a nested loop, a correlated subquery) carry the
-- entries they found dead from one rescan to the next and can mark a live entry dead on another
-- page once the index has grown; an exclusion check then skips that entry, and two bookings hold
-- one atom. Seen on 15.18 under load (TestKilledHolderMidStorm), reproduced by
-- TestExclusionSurvivesGiSTRescans. A scan that is never rescanned is safe, and an exclusion
-- check's scan never is; so the constraint's index is made one no query can use: partial, on a
-- column every row has true and no query names. Queries read bookings by node through a btree.
--
-- Adding the constraint again checks every booking: on a database the bug already let two
-- bookings overlap, this migration fails with the pair in the error, for a person to end one.

-- +goose Up
ALTER TABLE compute.bookings ADD COLUMN guarded boolean NOT NULL DEFAULT true CHECK (guarded);
CREATE INDEX bookings_node ON compute.bookings (node_id, resource);
-- The constraint is dropped and added again, same name and meaning, in one statement (one lock):
-- nothing a release of the window uses goes away (TestUpgradeInPlace runs N-2 on it).
-- compat: contract
ALTER TABLE compute.bookings DROP CONSTRAINT bookings_no_double_booking,
  ADD CONSTRAINT bookings_no_double_booking
    EXCLUDE USING gist (node_id WITH =, resource WITH =, atoms WITH &&, during WITH &&) WHERE (guarded);

-- +goose Down
ALTER TABLE compute.bookings DROP CONSTRAINT bookings_no_double_booking,
  ADD CONSTRAINT bookings_no_double_booking
    EXCLUDE USING gist (node_id WITH =, resource WITH =, atoms WITH &&, during WITH &&);
DROP INDEX compute.bookings_node;
ALTER TABLE compute.bookings DROP COLUMN guarded;
