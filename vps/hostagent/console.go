package hostagent

import (
	"context"
	"encoding/json"
	"os"
	"sync"

	"github.com/better-compute/compute/vps/hostapi"
)

// consoles serves the instances' serial consoles (and second ports) to access.console, each
// to the reservation that owns its instance alone: a ticket of another tenant's reservation,
// or an operator's without one, opens nothing, whatever name it carries. The owners are what
// the latest vps.instances part says (hostapi.Instance.Reservation); an instance whose part
// names no reservation (a control plane older than this host) serves its console to nobody.
type consoles struct {
	a *Agent

	mu     sync.Mutex
	owners map[string]string // instance → its reservation
}

// converge records the instances' owners, then converges the part.
func (c *consoles) converge(ctx context.Context, version uint32, payload []byte) error {
	owners := map[string]string{}
	var want hostapi.Instances
	if payload != nil && version == hostapi.InstancesVersion && json.Unmarshal(payload, &want) == nil {
		for _, in := range want.Instances {
			if in.Reservation != "" {
				owners[in.ID] = in.Reservation
			}
		}
	}
	c.mu.Lock()
	c.owners = owners
	c.mu.Unlock()
	return c.a.converge(ctx, version, payload)
}

// console finds the socket of a console by its name (hostapi.ConsoleName, hostapi.AgentName)
// for reservation: only the instance's own.
func (c *consoles) console(name, reservation string) (string, bool) {
	path := c.a.consolePath
	id, ok := hostapi.InstanceOfConsole(name)
	if !ok {
		id, ok = hostapi.InstanceOfAgent(name)
		path = c.a.agentPath
	}
	if !ok || !validID(id) || reservation == "" {
		return "", false
	}
	c.mu.Lock()
	owner := c.owners[id]
	c.mu.Unlock()
	if owner != reservation {
		return "", false
	}
	p := path(id)
	if _, err := os.Stat(p); err != nil {
		return "", false
	}
	return p, true
}
