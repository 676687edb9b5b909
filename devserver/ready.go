package devserver

import (
	"context"
	"fmt"
	"time"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/sim"
)

// waitSchedulable waits until every simulated node is schedulable with its GPUs counted, asking
// the API as a user would. A session comes up before the node's first inventory is written, so
// "connected" alone let a first reservation find no GPUs.
func (s *Server) waitSchedulable(ctx context.Context, fleet *sim.Fleet, gpus int) error {
	for {
		ready := 0
		var last error
		for _, n := range fleet.Nodes {
			ok, err := s.schedulable(ctx, n.NodeID(), gpus)
			if err != nil {
				last = err
			}
			if ok {
				ready++
			}
		}
		if ready == len(fleet.Nodes) {
			return nil
		}
		select {
		case <-ctx.Done():
			err := fmt.Errorf("%d of %d simulated nodes schedulable with their GPUs: %w", ready, len(fleet.Nodes), ctx.Err())
			if last != nil {
				err = fmt.Errorf("%w (last error: %w)", err, last)
			}
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// schedulable: the node is active and online, and its inventory (written with its capacity
// rollup, in one transaction) has gpus healthy GPUs in whole mode.
func (s *Server) schedulable(ctx context.Context, node string, gpus int) (bool, error) {
	n, err := s.Compute.API.Nodes.Get(ctx, s.APIKey, api.GetNode{Node: node})
	if err != nil || n.State != api.NodeActive || n.Status != api.NodeOnline {
		return false, err
	}
	devs, err := s.Compute.API.Devices.List(ctx, s.APIKey, api.ListDevices{Node: node})
	if err != nil {
		return false, err
	}
	whole := 0
	for _, d := range devs {
		if d.Mode == api.GPUModeWhole && d.Health != api.HealthUnhealthy {
			whole++
		}
	}
	return whole >= gpus, nil
}
