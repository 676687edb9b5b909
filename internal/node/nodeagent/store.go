// Package nodeagent is the node's side of the protocol, shared by bcd and the fleet simulator:
// joining, the session (heartbeats, inventory, health, desired state, commands, certificate
// renewal) and its reconnects. Hardware, the journal and what applies desired state are
// interfaces, with a fake, a memory store and a no-op for simulation and tests.
package nodeagent

import (
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	agentv1 "github.com/better-compute/compute/agent/v1"
)

// Identity is what a node is given at join, and renews.
type Identity struct {
	NodeID   string    `json:"nodeId"`
	NodeName string    `json:"nodeName"`
	KeyDER   []byte    `json:"key"` // PKCS #8; made on the node, never sent
	CertDER  []byte    `json:"cert"`
	CADER    [][]byte  `json:"ca"`
	Gateways []string  `json:"gateways"`
	NotAfter time.Time `json:"notAfter"`
	URL      string    `json:"url,omitempty"` // the control plane's API, which the node joined through
	// TakeoverSecret proves that this node is the one that joined, should it have to join again
	// under its name; the server keeps only its hash.
	TakeoverSecret []byte `json:"takeoverSecret,omitempty"`
}

// Store is the agent's journal: what must survive a restart or a cut connection. Every method
// is durable when it returns.
type Store interface {
	Identity() (Identity, bool, error)
	SetIdentity(Identity) error
	// Desired is the last desired state received and the generation applied.
	Desired() (*agentv1.DesiredState, int64, error)
	SetDesired(ds *agentv1.DesiredState, applied int64) error
	// Results are command results not yet acknowledged by the control plane.
	Results() ([]*agentv1.CommandResult, error)
	PutResult(*agentv1.CommandResult) error
	DeleteResult(commandID string) error
	// CommandState is how far a command got: a command sent again is not run twice, and one a
	// crash interrupted (started, no result) runs again.
	CommandState(commandID string) (CommandState, error)
	// MarkStarted records that a command began; PutResult records that it finished.
	MarkStarted(commandID string) error
}

// CommandState is how far the node got with a command.
type CommandState int

// The command states.
const (
	CommandUnseen CommandState = iota
	CommandStarted
	CommandDone
)

// MemoryStore is a Store in memory, for simulation and tests.
type MemoryStore struct {
	mu      sync.Mutex
	id      *Identity
	desired *agentv1.DesiredState
	applied int64
	results map[string]*agentv1.CommandResult
	order   []string
	seen    map[string]CommandState
}

// NewMemoryStore returns an empty store.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{results: map[string]*agentv1.CommandResult{}, seen: map[string]CommandState{}}
}

// Identity implements Store.
func (m *MemoryStore) Identity() (Identity, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.id == nil {
		return Identity{}, false, nil
	}
	return *m.id, true, nil
}

// SetIdentity implements Store.
func (m *MemoryStore) SetIdentity(id Identity) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.id = &id
	return nil
}

// Desired implements Store.
func (m *MemoryStore) Desired() (*agentv1.DesiredState, int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.desired == nil {
		return nil, m.applied, nil
	}
	return proto.Clone(m.desired).(*agentv1.DesiredState), m.applied, nil
}

// SetDesired implements Store.
func (m *MemoryStore) SetDesired(ds *agentv1.DesiredState, applied int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.desired, m.applied = proto.Clone(ds).(*agentv1.DesiredState), applied
	return nil
}

// Results implements Store.
func (m *MemoryStore) Results() ([]*agentv1.CommandResult, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*agentv1.CommandResult, 0, len(m.order))
	for _, id := range m.order {
		if r, ok := m.results[id]; ok {
			out = append(out, r)
		}
	}
	return out, nil
}

// PutResult implements Store.
func (m *MemoryStore) PutResult(r *agentv1.CommandResult) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.results[r.GetCommandId()]; !ok {
		m.order = append(m.order, r.GetCommandId())
	}
	m.results[r.GetCommandId()] = r
	m.seen[r.GetCommandId()] = CommandDone
	return nil
}

// DeleteResult implements Store.
func (m *MemoryStore) DeleteResult(id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.results, id)
	for i, o := range m.order {
		if o == id {
			m.order = append(m.order[:i], m.order[i+1:]...)
			break
		}
	}
	return nil
}

// CommandState implements Store.
func (m *MemoryStore) CommandState(id string) (CommandState, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.seen[id], nil
}

// MarkStarted implements Store.
func (m *MemoryStore) MarkStarted(id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.seen[id] == CommandUnseen {
		m.seen[id] = CommandStarted
	}
	return nil
}
