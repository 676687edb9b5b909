-- A gateway's heartbeat flush rewrites last_seen_at of every node it holds, once a second. With
-- full pages each new row version goes to another page and every index of compute.nodes gets an
-- entry (1.7 s for 10,000 nodes on a loaded machine); with room on the page the update is a
-- heap-only one, since no index covers last_seen_at, and writes no index (0.2 s). Pages written
-- from now on keep half free; older ones gain room as their rows move.

-- +goose Up
ALTER TABLE compute.nodes SET (fillfactor = 50);

-- +goose Down
ALTER TABLE compute.nodes RESET (fillfactor);
