package capacity_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/compute/api"
)

// TestNoConnectionWaitInsideTransaction: with a pool of two connections (the fewest migrations
// need), every kind of placement and read still completes. Calls that asked IAM (whose embedded
// port reads the same pool) for the tenant path while their transactions held every connection
// would wait forever; under load with a larger pool the same wait left every connection idle in
// transaction.
func TestNoConnectionWaitInsideTransaction(t *testing.T) {
	t.Parallel()
	f := newFleet(t, fleetSpec{nodes: 2, gpus: 8, vcpus: 64, mem: 256, maxConns: 2})
	ctx, cancel := context.WithTimeout(f.ctx, 60*time.Second)
	defer cancel()
	shapes := []api.CreateReservation{
		{Shape: api.Shape{GPUs: 1}},                // the batched path
		{Shape: api.Shape{GPUs: 1, VCPUs: 2}},      // placed alone
		{Shape: api.Shape{VCPUs: 1, MemoryGiB: 1}}, // no GPU
	}
	var wg sync.WaitGroup
	errs := make(chan error, 12)
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in := shapes[i%len(shapes)]
			in.Pool = "gpu"
			if _, err := f.Compute.API.Reservations.Create(ctx, f.RootKey, in); err != nil {
				errs <- err
				return
			}
			_, err := f.Compute.API.Reservations.List(ctx, f.RootKey, api.ListReservations{Pool: "gpu"})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("with a pool of two connections: %v", err)
		}
	}
}
