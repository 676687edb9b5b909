-- The placer's second pass, which counts what spot bookings hold as free for a normal request,
-- walks only the nodes that have spot holders: every other node with enough free GPUs was a
-- candidate of the first pass (node_capacity_model_fit, whose free-GPU column bounds the walk).

-- +goose Up
CREATE INDEX node_capacity_spot_fit ON compute.node_capacity (pool_id, gpu_model, gpus_free, node_id) WHERE schedulable AND gpus_spot > 0;

-- +goose Down
DROP INDEX compute.node_capacity_spot_fit;
