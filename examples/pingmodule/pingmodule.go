// Package pingmodule is a small module written the way a host writes its own: it adds API
// methods (pings.send, pings.get, pings.setBanner), its own tables, a command kind a node carries
// out (ping.echo, which may carry a write-only secret), a desired-state kind a node converges
// (ping.banner), a report kind a node sends up (ping.pong), event types (ping.sent,
// ping.ponged), an IAM resource type with its resolver, and the node side of all that
// (NodeSide.Extension for bcd or the simulator). It uses the core only through modules.Runtime
// and imports nothing from internal/; its test proves it end to end.
package pingmodule

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/agent/ext"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/iam"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
)

//go:embed migrations/*.sql
var migrationsFS embed.FS

// The module's names.
const (
	ResourcePing = "ping-ping"   // the IAM resource type of a ping
	CommandEcho  = "ping.echo"   // the node answers the message back
	DesiredKind  = "ping.banner" // the banner a node should show
	ReportPong   = "ping.pong"   // a node's pong, reported up its session
	EventSent    = "ping.sent"
	EventPonged  = "ping.ponged"
)

// The module's methods: declared with api.NewMethod, exactly as the core declares its own.
var (
	PingsSend      = api.NewMethod[Send, Ping]("pings", "send", true, ResourcePing, "v0.1", "Send a ping to a node; it answers through a command.")
	PingsGet       = api.NewMethod[Get, Ping]("pings", "get", false, ResourcePing, "v0.1", "Get a ping.")
	PingsSetBanner = api.NewMethod[SetBanner, Banner]("pings", "setBanner", true, ResourcePing, "v0.1", "Set the banner a node shows, through its desired state.")
)

// Send is the input of pings.send.
type Send struct {
	Node    string `json:"node"` // a node id
	Message string `json:"message"`
	// Secret, if set, travels to the node as the command's write-only secret: the node learns
	// it, no answer shows it.
	Secret string `json:"secret,omitempty"`
}

// Validate implements the input check.
func (in Send) Validate() error {
	if uuid.Validate(in.Node) != nil {
		return api.InvalidField("node", "must be a node id")
	}
	if in.Message == "" || len(in.Message) > 200 {
		return api.InvalidField("message", "must be 1 to 200 characters")
	}
	return nil
}

// Get is the input of pings.get.
type Get struct {
	Ping string `json:"ping"`
}

// Validate implements the input check.
func (in Get) Validate() error {
	if uuid.Validate(in.Ping) != nil {
		return api.InvalidField("ping", "must be a ping id")
	}
	return nil
}

// SetBanner is the input of pings.setBanner.
type SetBanner struct {
	Node   string `json:"node"`
	Banner string `json:"banner"`
}

// Validate implements the input check.
func (in SetBanner) Validate() error {
	if uuid.Validate(in.Node) != nil {
		return api.InvalidField("node", "must be a node id")
	}
	if len(in.Banner) > 200 {
		return api.InvalidField("banner", "must be at most 200 characters")
	}
	return nil
}

// Ping is a ping sent; CommandID is the command that carries it.
type Ping struct {
	ID        string `json:"id"`
	TenantID  string `json:"tenantId"`
	NodeID    string `json:"nodeId"`
	Message   string `json:"message"`
	CommandID string `json:"commandId"`
}

// Banner is a node's banner.
type Banner struct {
	NodeID string `json:"nodeId"`
	Banner string `json:"banner"`
}

// Module is the ping module.
type Module struct{}

// Name implements modules.Module.
func (Module) Name() string { return "ping" }

// Register implements modules.Module.
func (Module) Register(r *modules.Registry) error {
	r.Migrations(postgres.EmbeddedMigrations("ping", "compute", migrationsFS))
	r.ResourceTypes(iam.ResourceType{Name: ResourcePing, Description: "A ping sent to a node."})
	r.Actions(modules.ActionsFor(PingsSend.Info(), PingsGet.Info(), PingsSetBanner.Info())...)
	r.Resolver(ResourcePing, func(ctx context.Context, q postgres.Querier, id string) (map[string]any, error) {
		if uuid.Validate(id) != nil {
			return nil, nil
		}
		return modules.ResolveRow(q.QueryRow(ctx, `SELECT id::text, tenant_id, '{}'::jsonb, jsonb_build_object('node', node_id::text)
			FROM compute.ping_pings WHERE id = $1`, id))
	})
	r.EventTypes(modules.EventType{Name: EventSent, Description: "A ping was sent to a node (data: node, command)."},
		modules.EventType{Name: EventPonged, Description: "A node reported a pong (data: message)."})
	r.ReportKind(modules.ReportKind{Name: ReportPong, Handle: func(ctx context.Context, rp *modules.Report) error {
		var pong struct {
			Message string `json:"message"`
		}
		if err := json.Unmarshal(rp.Payload, &pong); err != nil || pong.Message == "" {
			return api.InvalidField("message", "a pong needs a message")
		}
		return rp.Runtime.Events.Emit(ctx, rp.Tx, modules.Event{Type: EventPonged, TenantID: rp.TenantID, Subject: rp.NodeID,
			Data: map[string]any{"message": pong.Message}})
	}})
	r.CommandKind(modules.CommandKind{Name: CommandEcho, Summary: "Answer a message back.",
		Check: func(_ context.Context, _ postgres.Querier, _ string, args json.RawMessage) error {
			var a struct {
				Message string `json:"message"`
			}
			if err := json.Unmarshal(args, &a); err != nil || a.Message == "" {
				return api.InvalidField("args.message", "ping.echo needs a message")
			}
			return nil
		}})
	r.DesiredKind(modules.DesiredKind{Name: DesiredKind, Version: 1,
		State: func(ctx context.Context, q postgres.Querier, node string) (any, error) {
			var b Banner
			err := q.QueryRow(ctx, `SELECT node_id::text, banner FROM compute.ping_banners WHERE node_id = $1`, node).Scan(&b.NodeID, &b.Banner)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil, nil
			}
			return b, err
		}})
	modules.Handle(r, PingsSend, nil, send)
	modules.Handle(r, PingsGet, nil, get)
	modules.Handle(r, PingsSetBanner, nil, setBanner)
	return nil
}

func send(ctx context.Context, c *modules.Call, in Send) (Ping, error) {
	rt := c.Runtime
	args, _ := json.Marshal(map[string]string{"message": in.Message})
	var secret json.RawMessage
	if in.Secret != "" {
		secret, _ = json.Marshal(map[string]string{"secret": in.Secret})
	}
	cmd, err := rt.Nodes.Command(ctx, c, api.CreateCommand{NodeRef: api.NodeRef{Node: in.Node}, Kind: CommandEcho, Args: args, Secret: secret, Deadline: "1m"})
	if err != nil {
		return Ping{}, err
	}
	now, err := rt.Clock.Now(ctx, c.Tx)
	if err != nil {
		return Ping{}, err
	}
	p := Ping{ID: uuid.Must(uuid.NewV7()).String(), TenantID: c.Target.TenantID, NodeID: in.Node, Message: in.Message, CommandID: cmd.ID}
	if _, err := c.Tx.Exec(ctx, `INSERT INTO compute.ping_pings (id, tenant_id, node_id, message, command_id, created_at) VALUES ($1, $2, $3, $4, $5, $6)`,
		p.ID, p.TenantID, p.NodeID, p.Message, p.CommandID, now); err != nil {
		return Ping{}, err
	}
	return p, rt.Events.Emit(ctx, c.Tx, modules.Event{Type: EventSent, TenantID: p.TenantID, Subject: p.ID,
		Data: map[string]any{"node": p.NodeID, "command": p.CommandID}})
}

func get(ctx context.Context, c *modules.Call, in Get) (Ping, error) {
	var p Ping
	err := c.Tx.QueryRow(ctx, `SELECT id::text, tenant_id, node_id::text, message, command_id::text FROM compute.ping_pings
		WHERE id = $1 AND tenant_id = $2`, in.Ping, c.Target.TenantID).Scan(&p.ID, &p.TenantID, &p.NodeID, &p.Message, &p.CommandID)
	if errors.Is(err, pgx.ErrNoRows) {
		return p, api.NotFound("ping", in.Ping)
	}
	return p, err
}

func setBanner(ctx context.Context, c *modules.Call, in SetBanner) (Banner, error) {
	// Another tenant's node reads as one that does not exist.
	node, err := c.Runtime.Fleet.TenantNode(ctx, c.Tx, c.Target.TenantID, api.NodeRef{Node: in.Node})
	if err != nil {
		return Banner{}, err
	}
	if _, err := c.Tx.Exec(ctx, `INSERT INTO compute.ping_banners (node_id, tenant_id, banner) VALUES ($1, $2, $3)
		ON CONFLICT (node_id) DO UPDATE SET banner = excluded.banner`, node, c.Target.TenantID, in.Banner); err != nil {
		return Banner{}, err
	}
	if err := c.Runtime.Nodes.BumpDesired(ctx, c.Tx, node); err != nil {
		return Banner{}, err
	}
	return Banner{NodeID: in.Node, Banner: in.Banner}, nil
}

// NodeSide is the module's half on a node: it answers ping.echo and shows the ping.banner part
// of the desired state (here: remembers it).
type NodeSide struct {
	mu     sync.Mutex
	banner string
	echoes int
	secret string
}

// Extension is what the node's agent runs for the module.
func (n *NodeSide) Extension() ext.Extension {
	return ext.Extension{
		Name: "ping",
		Commands: map[string]ext.Command{CommandEcho: func(ctx context.Context, args map[string]any) (map[string]any, error) {
			var s struct {
				Secret string `json:"secret"`
			}
			if b := ext.SecretOf(ctx); b != nil {
				if err := json.Unmarshal(b, &s); err != nil {
					return nil, fmt.Errorf("ping.echo: the secret: %w", err)
				}
			}
			n.mu.Lock()
			n.echoes++
			n.secret = s.Secret
			n.mu.Unlock()
			return map[string]any{"echo": args["message"], "secretBytes": len(s.Secret)}, nil
		}},
		Desired: map[string]ext.Converger{DesiredKind: func(_ context.Context, version uint32, payload []byte) error {
			if payload == nil {
				n.set("")
				return nil
			}
			if version != 1 {
				return fmt.Errorf("ping.banner version %d is not known here", version)
			}
			var b Banner
			if err := json.Unmarshal(payload, &b); err != nil {
				return err
			}
			n.set(b.Banner)
			return nil
		}},
	}
}

func (n *NodeSide) set(b string) {
	n.mu.Lock()
	n.banner = b
	n.mu.Unlock()
}

// Secret is the secret the last ping.echo carried ("" for none).
func (n *NodeSide) Secret() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.secret
}

// Banner is the banner the node shows now.
func (n *NodeSide) Banner() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.banner
}
