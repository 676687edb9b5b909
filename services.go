package compute

import (
	"context"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/access"
	"github.com/better-compute/compute/internal/core/capacity"
	"github.com/better-compute/compute/internal/core/events"
	"github.com/better-compute/compute/internal/core/fleet"
	"github.com/better-compute/compute/internal/core/nodes"
	"github.com/better-compute/compute/internal/core/pki"
	"github.com/better-compute/compute/internal/core/quorum"
	"github.com/better-compute/compute/internal/core/workflow"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

// newRuntime is what modules get of the core (modules.Runtime): the database, IAM and the
// core's services, each a thin adapter over the package that owns what it writes.
func newRuntime(o Options, reg *modules.Registry, nm *nodes.Module, leases *capacity.Leases) *modules.Runtime {
	rt := &modules.Runtime{
		DB: o.Database, IAM: o.IAM, Logger: o.Logger, Secret: o.Secret,
		Capacity: capacity.Service{Leases: leases},
		Nodes:    nodeService{reg},
		Fleet:    fleetService{nm},
		Events:   eventService{reg},
		Clock:    clock{},
		Secrets:  secretBox{o.Secret},
		Access:   access.Service{},
		Quorum:   quorum.Service{},
		Outbound: o.outbound,
		Registry: reg,
	}
	rt.Workflows = workflow.Service{RT: rt}
	return rt
}

type nodeService struct{ reg *modules.Registry }

func (s nodeService) Command(ctx context.Context, c *modules.Call, in api.CreateCommand) (api.Command, error) {
	if err := api.CheckInput(in); err != nil {
		return api.Command{}, err
	}
	if err := in.Validate(); err != nil {
		return api.Command{}, err
	}
	return nodes.QueueCommand(ctx, c, s.reg, in)
}

func (nodeService) BumpDesired(ctx context.Context, tx pgx.Tx, ids ...string) error {
	return nodes.BumpDesired(ctx, tx, ids...)
}

func (nodeService) GetCommand(ctx context.Context, q postgres.Querier, id string) (api.Command, error) {
	return nodes.GetCommand(ctx, q, id)
}

type fleetService struct{ nm *nodes.Module }

func (fleetService) PoolID(ctx context.Context, q postgres.Querier, tenant, ref string) (string, error) {
	return fleet.PoolID(ctx, q, tenant, ref)
}

func (fleetService) NodeID(ctx context.Context, q postgres.Querier, pool, ref string) (string, error) {
	return fleet.NodeIDIn(ctx, q, pool, ref)
}

func (fleetService) TenantNode(ctx context.Context, q postgres.Querier, tenant string, ref api.NodeRef) (string, error) {
	if err := ref.Validate(); err != nil {
		return "", err
	}
	ref.TenantID = tenant // a pool named in ref is the tenant's
	t, err := fleet.NodeTarget(ctx, modules.Lookup{Q: q}, ref)
	if err != nil {
		return "", err
	}
	if t.TenantID != tenant {
		return "", api.NotFound("node", ref.Node)
	}
	return t.ResourceID, nil
}

func (s fleetService) CAHash() (string, error) {
	a, err := s.nm.Authority()
	if err != nil {
		return "", err
	}
	return nodes.CAHash(a.Certificate()), nil
}

func (fleetService) PoolSite(ctx context.Context, q postgres.Querier, pool string) (string, error) {
	return fleet.PoolSite(ctx, q, pool)
}

func (fleetService) SiteAgents(ctx context.Context, q postgres.Querier, site string) ([]string, error) {
	return fleet.SiteAgents(ctx, q, site)
}

type eventService struct{ reg *modules.Registry }

func (s eventService) Emit(ctx context.Context, q postgres.Querier, e modules.Event) error {
	if !s.reg.HasEventType(e.Type) {
		return fmt.Errorf("compute: event type %q is not registered (modules.Registry.EventTypes)", e.Type)
	}
	if e.TenantID == "" || e.Subject == "" {
		return fmt.Errorf("compute: event %s needs a tenant and a subject", e.Type)
	}
	return events.Emit(ctx, q, e.Type, e.TenantID, e.Subject, e.Data)
}

type clock struct{}

func (clock) Now(ctx context.Context, q postgres.Querier) (time.Time, error) {
	var t time.Time
	err := q.QueryRow(ctx, `SELECT compute.compute_now()`).Scan(&t)
	return t, err
}

// secretBox seals with AES-256-GCM under a key derived from Options.Secret for each purpose, the
// purpose also bound as additional data: a value sealed for one purpose opens for no other.
type secretBox struct{ secret string }

func (b secretBox) aead(purpose string) (cipher.AEAD, error) {
	if purpose == "" {
		return nil, errors.New("compute: a secret needs a purpose")
	}
	return pki.SecretCipher(b.secret, "better-compute module secret: "+purpose)
}

func (b secretBox) Seal(purpose string, plaintext []byte) ([]byte, error) {
	a, err := b.aead(purpose)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, a.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return a.Seal(nonce, nonce, plaintext, []byte(purpose)), nil
}

func (b secretBox) Open(purpose string, sealed []byte) ([]byte, error) {
	a, err := b.aead(purpose)
	if err != nil {
		return nil, err
	}
	if len(sealed) < a.NonceSize() {
		return nil, errors.New("compute: not a sealed secret")
	}
	out, err := a.Open(nil, sealed[:a.NonceSize()], sealed[a.NonceSize():], []byte(purpose))
	if err != nil {
		return nil, errors.New("compute: the secret does not open: sealed for another purpose, with another Options.Secret, or damaged")
	}
	return out, nil
}
