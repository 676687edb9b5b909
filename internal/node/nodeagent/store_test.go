package nodeagent_test

import (
	"testing"

	"github.com/better-compute/compute/internal/node/nodeagent"
	"github.com/better-compute/compute/internal/node/nodeagent/storetest"
)

func TestMemoryStore(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(*testing.T) nodeagent.Store { return nodeagent.NewMemoryStore() }, nil)
}
