package vps

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/postgres"
	"github.com/better-compute/compute/vps/hostapi"
)

const instanceColumns = `i.id::text, i.tenant_id, i.name, f.name, i.flavor_id::text, m.name, i.image_id::text, i.reservation_id::text, i.node_id::text,
	i.power, i.status, i.status_detail, i.status_at, i.deleted_at, i.deleted_reason, i.labels, i.created_by, i.created_at, i.kind`

const instanceFrom = ` FROM compute.vps_instances i JOIN compute.vps_flavors f ON f.id = i.flavor_id JOIN compute.vps_images m ON m.id = i.image_id`

func scanInstance(row pgx.Row) (Instance, error) {
	var i Instance
	err := row.Scan(&i.ID, &i.TenantID, &i.Name, &i.Flavor, &i.FlavorID, &i.Image, &i.ImageID, &i.ReservationID, &i.NodeID,
		&i.Power, &i.Status, &i.StatusDetail, &i.StatusAt, &i.DeletedAt, &i.DeletedReason, &i.Labels, &i.CreatedBy, &i.CreatedAt, &i.kind)
	return i, err
}

func getInstance(ctx context.Context, q postgres.Querier, id string) (Instance, error) {
	i, err := scanInstance(q.QueryRow(ctx, `SELECT `+instanceColumns+instanceFrom+` WHERE i.id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return i, api.NotFound("instance", id)
	}
	if err != nil {
		return i, err
	}
	nics, err := instanceNICs(ctx, q, []string{i.ID})
	i.NICs = nics[i.ID]
	return i, err
}

// instanceTarget finds an instance by id, or by name among the tenant's live ones.
func instanceTarget(ctx context.Context, l modules.Lookup, in InstanceRef) (modules.Target, error) {
	return kindTarget(ctx, l, kindInstance, in.TenantID, in.Instance)
}

// kindTarget finds an instance of a kind (an instance, a sandbox) by id, or by name among the
// tenant's live ones.
func kindTarget(ctx context.Context, l modules.Lookup, kind, tenantID, ref string) (modules.Target, error) {
	t := modules.Target{Existing: true, Kind: kind, Ref: ref}
	tenant := modules.TenantTarget(l.Principal, tenantID).TenantID
	err := l.Q.QueryRow(ctx, `SELECT id::text, tenant_id FROM compute.vps_instances
		WHERE (id::text = $1 OR (tenant_id = $2 AND name = $1 AND deleted_at IS NULL)) AND kind = $3 ORDER BY (id::text = $1) DESC LIMIT 1`, ref, tenant, kind).
		Scan(&t.ResourceID, &t.TenantID)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, api.NotFound(kind, ref)
	}
	return t, err
}

// The kinds of instance (vps_instances.kind).
const (
	kindInstance = "instance"
	kindSandbox  = "sandbox"
	kindWarm     = "warm" // booted and paused in a template's warm pool
)

func (m *Module) registerInstances(r *modules.Registry) {
	modules.Handle(r, InstancesCreate, nil, createInstance)
	modules.Handle(r, InstancesGet, instanceTarget, func(ctx context.Context, c *modules.Call, _ InstanceRef) (Instance, error) {
		return getInstance(ctx, c.Tx, c.Target.ResourceID)
	})
	modules.Handle(r, InstancesList, nil, listInstances)
	modules.Handle(r, InstancesStart, instanceTarget, setPower(PowerRunning))
	modules.Handle(r, InstancesStop, instanceTarget, setPower(PowerStopped))
	modules.Handle(r, InstancesPause, instanceTarget, setPower(PowerPaused))
	modules.Handle(r, InstancesReboot, instanceTarget, func(ctx context.Context, c *modules.Call, _ InstanceRef) (Instance, error) {
		return change(ctx, c, func(i Instance) (string, error) {
			if i.Power != PowerRunning {
				return "", api.Errorf(api.CodeFailedPrecondition, "instance %s is %s: only a running instance reboots", i.Name, i.Power).With("reason", "not_running")
			}
			return `reboots = reboots + 1`, nil
		})
	})
	modules.Handle(r, InstancesDelete, instanceTarget, func(ctx context.Context, c *modules.Call, _ InstanceRef) (Instance, error) {
		if err := endInstance(ctx, c, c.Target.ResourceID, "deleted"); err != nil {
			return Instance{}, err
		}
		return getInstance(ctx, c.Tx, c.Target.ResourceID) // deleting a deleted instance answers it as it is
	})
	modules.Handle(r, InstancesConsole, instanceTarget, func(ctx context.Context, c *modules.Call, _ InstanceRef) (api.TunnelTicket, error) {
		return consoleTicket(ctx, c, hostapi.ConsoleName)
	})
}

// createInstance books the flavor's capacity in the pool, on a VM host, and records the instance;
// the host hears of it when the call commits. No host with room, or a pool with no VM host,
// books nothing.
func createInstance(ctx context.Context, c *modules.Call, in CreateInstance) (Instance, error) {
	f, err := flavorOf(ctx, c.Tx, c.Target.TenantID, in.Flavor)
	if err != nil {
		return Instance{}, err
	}
	img, err := imageOf(ctx, c.Tx, c.Target.TenantID, in.Image)
	if err != nil {
		return Instance{}, err
	}
	return launch(ctx, c, launchSpec{kind: kindInstance, name: in.Name, pool: in.Pool, flavor: f, image: img, power: in.Power,
		duration: in.Duration, labels: in.Labels, networks: in.Networks, userData: in.UserData})
}

// launchSpec is an instance to book and record.
type launchSpec struct {
	kind, name, pool string
	flavor           Flavor
	image            VMImage
	power, duration  string
	labels           map[string]string
	template         string        // a sandbox's or warm instance's
	ttl              time.Duration // a sandbox's
	networks         []InstanceNIC
	userData         string
}

// launch books an instance's capacity on a VM host of the pool and records it, in c's
// transaction; its host hears of it when the transaction commits.
func launch(ctx context.Context, c *modules.Call, s launchSpec) (Instance, error) {
	f := s.flavor
	id := uuid.Must(uuid.NewV7()).String()
	if s.name == "" {
		s.name = "sbx-" + id[len(id)-12:]
	}
	// VM hosts whose runtime does not answer are no place for it (hosts.go).
	avoid, err := unreachableHosts(ctx, c.Tx)
	if err != nil {
		return Instance{}, err
	}
	res, err := c.Runtime.Capacity.Reserve(ctx, c, api.CreateReservation{TenantID: c.Target.TenantID, Pool: s.pool,
		Shape:         api.Shape{VCPUs: f.VCPUs, MemoryGiB: f.MemoryGiB, GPUs: f.GPUs, Model: f.GPUModel, MIGProfile: f.MIGProfile},
		RequireLabels: f.RequireLabels, Duration: s.duration, Labels: map[string]string{"vps." + s.kind: id}}, avoid...)
	if api.CodeOf(err) == api.CodeConflict && len(avoid) > 0 {
		return Instance{}, unreachableConflict(ctx, c, s.pool, avoid, err)
	}
	if err != nil {
		return Instance{}, err
	}
	if len(res.Allocations) != 1 {
		return Instance{}, fmt.Errorf("vps: instance %s's reservation has %d allocations, want 1", id, len(res.Allocations))
	}
	node := res.Allocations[0].NodeID
	var runtime, unreachable string
	err = c.Tx.QueryRow(ctx, `SELECT runtime, unreachable FROM compute.vps_hosts WHERE node_id = $1`, node).Scan(&runtime, &unreachable)
	if errors.Is(err, pgx.ErrNoRows) {
		return Instance{}, api.Errorf(api.CodeFailedPrecondition,
			"node %s of pool %s, where the instance was placed, runs no VM runtime (bcd node --vps-runtime): give the flavor requireLabels that only VM hosts carry",
			res.Allocations[0].Node, s.pool).With("reason", "no_vm_host").With("node", node)
	}
	if err != nil {
		return Instance{}, err
	}
	if unreachable != "" { // it stopped answering as the placement was made
		return Instance{}, api.Errorf(api.CodeConflict, "node %s of pool %s, where the instance was placed, has just stopped reaching its VM runtime: try again",
			res.Allocations[0].Node, s.pool).With("reason", "vm_host_unreachable").With("node", node)
	}
	power := cmp.Or(s.power, PowerRunning)
	labels := s.labels
	if labels == nil {
		labels = map[string]string{}
	}
	var template *string
	var expires *time.Duration // pgx writes a Duration as an interval
	if s.template != "" {
		template = &s.template
	}
	if s.kind == kindSandbox {
		expires = &s.ttl
	}
	if _, err := allocate(ctx, c.Tx, c.Target.TenantID, id, s.networks); err != nil {
		return Instance{}, err
	}
	var sshCA string
	if s.kind != kindInstance { // a sandbox's guest takes SSH certificates of its tenant's CA
		if sshCA, err = c.Runtime.Access.SSHCA(ctx, c); err != nil {
			return Instance{}, err
		}
	}
	_, err = c.Tx.Exec(ctx, `INSERT INTO compute.vps_instances (id, tenant_id, name, flavor_id, image_id, reservation_id, node_id, power, labels, created_by,
			kind, template_id, expires_at, user_data, ssh_ca)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, compute.compute_now() + $13::interval, $14, $15)`,
		id, c.Target.TenantID, s.name, f.ID, s.image.ID, res.ID, node, power, labels, c.Principal.ID, s.kind, template, expires, s.userData, sshCA)
	if postgres.ErrorCode(err) == postgres.UniqueViolation {
		return Instance{}, api.Errorf(api.CodeConflict, "the tenant has a live instance or sandbox named %q", s.name).With("reason", "name_taken")
	}
	if err != nil {
		return Instance{}, err
	}
	if err := c.Runtime.Nodes.BumpDesired(ctx, c.Tx, node); err != nil {
		return Instance{}, err
	}
	if s.kind != kindWarm { // a warm one is no one's yet: its sandbox's creation is the event
		if err := c.Runtime.Events.Emit(ctx, c.Tx, modules.Event{Type: eventOf(s.kind, "created"), TenantID: c.Target.TenantID, Subject: id,
			Data: map[string]any{"name": s.name, "flavor": f.Name, "node": node, "reservation": res.ID, "runtime": runtime}}); err != nil {
			return Instance{}, err
		}
	}
	return getInstance(ctx, c.Tx, id)
}

// eventOf is the type of an event of an instance of a kind: instance.created, sandbox.created.
func eventOf(kind, what string) string {
	if kind == kindInstance {
		return "instance." + what
	}
	return "sandbox." + what
}

func listInstances(ctx context.Context, c *modules.Call, in ListInstances) (api.Page[Instance], error) {
	var before *string
	if in.Cursor != "" {
		key, err := api.DecodeCursor("vn1", in.Cursor)
		if err != nil {
			return api.Page[Instance]{}, err
		}
		before = &key
	}
	limit := in.PageLimit()
	rows, err := c.Tx.Query(ctx, `SELECT `+instanceColumns+instanceFrom+` WHERE i.tenant_id = $1 AND i.kind = 'instance' AND ($2::text IS NULL OR i.id::text < $2)
		AND ($3 = '' OR i.node_id::text = $3) AND ($4 = '' OR i.status = $4) AND ($5 OR i.deleted_at IS NULL)
		ORDER BY i.id DESC LIMIT $6`, c.Target.TenantID, before, in.Node, in.Status, in.Deleted || in.Status == "deleted", limit+1)
	if err != nil {
		return api.Page[Instance]{}, err
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Instance, error) { return scanInstance(r) })
	if err != nil {
		return api.Page[Instance]{}, err
	}
	return api.PageOf(items, limit, "vn1", func(i Instance) string { return i.ID }), nil
}

// change changes a live instance (set is an SQL assignment, from what it is now) and tells its
// host.
func change(ctx context.Context, c *modules.Call, set func(Instance) (string, error)) (Instance, error) {
	i, err := scanInstance(c.Tx.QueryRow(ctx, `SELECT `+instanceColumns+instanceFrom+` WHERE i.id = $1 FOR UPDATE OF i`, c.Target.ResourceID))
	if err != nil {
		return i, err
	}
	if i.DeletedAt != nil {
		return i, api.Errorf(api.CodeFailedPrecondition, "instance %s was deleted (%s)", i.Name, i.DeletedReason).With("reason", "deleted")
	}
	assign, err := set(i)
	if err != nil || assign == "" {
		return i, err
	}
	if _, err := c.Tx.Exec(ctx, `UPDATE compute.vps_instances SET `+assign+` WHERE id = $1`, i.ID); err != nil {
		return i, err
	}
	if err := c.Runtime.Nodes.BumpDesired(ctx, c.Tx, i.NodeID); err != nil {
		return i, err
	}
	return getInstance(ctx, c.Tx, i.ID)
}

func setPower(power string) modules.RunFunc[InstanceRef, Instance] {
	return func(ctx context.Context, c *modules.Call, _ InstanceRef) (Instance, error) {
		return change(ctx, c, func(i Instance) (string, error) {
			if i.Power == power {
				return "", nil // already asked: nothing to change
			}
			return `power = '` + power + `'`, nil
		})
	}
}

// deleteInstance records an instance's end and tells its host, which removes its VM.
func deleteInstance(ctx context.Context, tx pgx.Tx, rt *modules.Runtime, i Instance, reason string) (Instance, error) {
	if _, err := releaseAddresses(ctx, tx, i.ID); err != nil {
		return i, err
	}
	if _, err := tx.Exec(ctx, `UPDATE compute.vps_instances SET deleted_at = compute.compute_now(), deleted_reason = $2, status = 'deleted'
		WHERE id = $1 AND deleted_at IS NULL`, i.ID, reason); err != nil {
		return i, err
	}
	if err := rt.Nodes.BumpDesired(ctx, tx, i.NodeID); err != nil {
		return i, err
	}
	if i.kind != kindWarm {
		typ := eventOf(i.kind, "deleted")
		switch {
		case reason == "expired":
			typ = EventSandboxExpired
		case strings.HasPrefix(reason, reasonLost+":"):
			typ = eventOf(i.kind, "lost")
		}
		if err := rt.Events.Emit(ctx, tx, modules.Event{Type: typ, TenantID: i.TenantID, Subject: i.ID,
			Data: map[string]any{"name": i.Name, "reason": reason}}); err != nil {
			return i, err
		}
	}
	return getInstance(ctx, tx, i.ID)
}

// endWithReservations deletes the live instances whose reservation ended (expired, preempted,
// drained, released by hand): their capacity is no longer theirs.
func endWithReservations(ctx context.Context, rt *modules.Runtime) error {
	return rt.DB.Tx(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT `+instanceColumns+instanceFrom+` WHERE i.deleted_at IS NULL ORDER BY i.id FOR UPDATE OF i SKIP LOCKED`)
		if err != nil {
			return err
		}
		live, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Instance, error) { return scanInstance(r) })
		if err != nil || len(live) == 0 {
			return err
		}
		ids := make([]string, len(live))
		for n, i := range live {
			ids[n] = i.ReservationID
		}
		rs, err := rt.Capacity.Reservations(ctx, tx, ids)
		if err != nil {
			return err
		}
		ended := map[string]string{}
		for _, r := range rs {
			if r.State != api.ReservationActive && r.State != api.ReservationPending {
				ended[r.ID] = r.EndReason
			}
		}
		for _, i := range live {
			if reason, ok := ended[i.ReservationID]; ok {
				if _, err := deleteInstance(ctx, tx, rt, i, "reservation "+reason); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// desiredInstances is a node's vps.instances part: its live instances whose reservation holds
// it now.
func (m *Module) desiredInstances(ctx context.Context, q postgres.Querier, nodeID string) (any, error) {
	rows, err := q.Query(ctx, `SELECT i.id::text, m.tenant_id, i.reservation_id::text, f.vcpus, f.memory_gib, f.disk_gib, m.kernel_url, m.kernel_sha256,
		m.initrd_url, m.initrd_sha256, m.cmdline, m.disk_url, m.disk_sha256, i.power, i.reboots, coalesce(t.env, '{}'),
		ARRAY(SELECT s.id::text FROM compute.vps_snapshots s WHERE s.instance_id = i.id AND s.deleted_at IS NULL AND s.status <> 'failed' ORDER BY s.id),
		coalesce(i.restore_snapshot::text, ''), i.restores, CASE WHEN i.kind = 'warm' THEN t.ready_line ELSE '' END, i.name, i.user_data, i.ssh_ca
		FROM compute.vps_instances i JOIN compute.vps_flavors f ON f.id = i.flavor_id JOIN compute.vps_images m ON m.id = i.image_id
		LEFT JOIN compute.vps_sandbox_templates t ON t.id = i.template_id
		WHERE i.node_id = $1 AND i.deleted_at IS NULL ORDER BY i.id`, nodeID)
	if err != nil {
		return nil, err
	}
	type row struct {
		hostapi.Instance
		reservation, name, userData, sshCA string
	}
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		var memGiB, restores int
		var k, ks, ir, irs, d, ds, restore string
		err := r.Scan(&x.ID, &x.Tenant, &x.reservation, &x.VCPUs, &memGiB, &x.DiskGiB, &k, &ks, &ir, &irs, &x.Cmdline, &d, &ds, &x.Power, &x.Reboots,
			&x.Env, &x.Snapshots, &restore, &restores, &x.ReadyLine, &x.name, &x.userData, &x.sshCA)
		if err == nil && x.sshCA != "" { // a sandbox: SSH on its second serial port, for its reservation's holders
			x.Agent = true
			x.Env["BC_SSH_CA"] = x.sshCA
			x.Env["BC_SSH_PRINCIPAL"] = api.ReservationPrincipal(x.reservation)
		}
		x.MemoryMiB = memGiB << 10
		x.Kernel, x.Initrd, x.Disk = hostArtifact(k, ks), hostArtifact(ir, irs), hostArtifact(d, ds)
		if restore != "" {
			x.Restore = &hostapi.Restore{Snapshot: restore, Serial: restores}
		}
		if len(x.Env) == 0 {
			x.Env = nil
		}
		if len(x.Snapshots) == 0 {
			x.Snapshots = nil
		}
		return x, err
	})
	if err != nil || len(all) == 0 {
		return nil, err
	}
	ids := make([]string, len(all))
	for n, x := range all {
		ids[n] = x.reservation
	}
	rs, err := m.capacity.Reservations(ctx, q, ids)
	if err != nil {
		return nil, err
	}
	holds := map[string][]string{} // reservation → the GPUs it holds on this node
	active := map[string]bool{}
	for _, r := range rs {
		active[r.ID] = r.State == api.ReservationActive
		for _, a := range r.Allocations {
			if a.NodeID == nodeID {
				for _, g := range a.GPUs {
					holds[r.ID] = append(holds[r.ID], g.UUID)
				}
			}
		}
	}
	instances := make([]string, len(all))
	for n, x := range all {
		instances[n] = x.ID
	}
	nics, err := instanceNICs(ctx, q, instances)
	if err != nil {
		return nil, err
	}
	out := hostapi.Instances{Instances: []hostapi.Instance{}}
	for _, x := range all {
		if active[x.reservation] {
			x.GPUs = holds[x.reservation]
			x.Reservation = x.reservation // its consoles are its reservation's alone (hostagent's consoles)
			x.NICs = nics[x.ID]
			if x.Agent { // a sandbox: its guest refuses its reservation's revoked certificates
				if x.SSHRevoked, err = m.access.SSHRevoked(ctx, q, x.reservation); err != nil {
					return nil, err
				}
			}
			if len(x.NICs) > 0 || x.userData != "" {
				x.CloudInit = cloudInit(x.ID, x.name, x.userData, x.NICs)
			}
			out.Instances = append(out.Instances, x.Instance)
		}
	}
	return out, nil
}

func hostArtifact(url, sum string) *hostapi.Artifact {
	if url == "" {
		return nil
	}
	return &hostapi.Artifact{URL: url, SHA256: sum}
}

// statusReported records what a host found of its instances; an instance of its desired state
// that it did not find is pending still.
func statusReported(ctx context.Context, r *modules.Report) error {
	var s hostapi.Status
	if err := json.Unmarshal(r.Payload, &s); err != nil {
		return api.InvalidField("instances", "a vps.instance_status report is {\"instances\": [...]}")
	}
	for _, st := range s.Instances {
		switch st.State {
		case "running", "paused", "stopped", "error":
		default:
			continue // a state this control plane does not know: left as it was
		}
		if len(st.Detail) > 1024 {
			st.Detail = st.Detail[:1024]
		}
		if err := snapshotsReported(ctx, r, st); err != nil {
			return err
		}
		var tenant, name, kind string
		if st.Ready {
			if _, err := r.Tx.Exec(ctx, `UPDATE compute.vps_instances SET ready = true WHERE id::text = $1 AND node_id = $2 AND kind = 'warm' AND NOT ready`,
				st.ID, r.NodeID); err != nil {
				return err
			}
		}
		err := r.Tx.QueryRow(ctx, `UPDATE compute.vps_instances SET status = $3, status_detail = $4, status_at = compute.compute_now()
			WHERE id::text = $1 AND node_id = $2 AND deleted_at IS NULL AND (status <> $3 OR status_detail <> $4) RETURNING tenant_id, name, kind`,
			st.ID, r.NodeID, st.State, st.Detail).Scan(&tenant, &name, &kind)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // unchanged, or not this host's
		}
		if err != nil {
			return err
		}
		if kind == kindWarm {
			continue // no one's yet
		}
		if err := r.Runtime.Events.Emit(ctx, r.Tx, modules.Event{Type: eventOf(kind, "status"), TenantID: tenant, Subject: st.ID,
			Data: map[string]any{"name": name, "status": st.State, "detail": st.Detail}}); err != nil {
			return err
		}
	}
	return nil
}

// snapshotsReported marks the instance's pending snapshots its host has as ready, and those it
// could not save as failed; a restore that failed is said in the snapshot's detail.
func snapshotsReported(ctx context.Context, r *modules.Report, st hostapi.InstanceStatus) error {
	if len(st.Snapshots) == 0 && len(st.SnapshotErrors) == 0 {
		return nil
	}
	failed, why := make([]string, 0, len(st.SnapshotErrors)), make([]string, 0, len(st.SnapshotErrors))
	for id, w := range st.SnapshotErrors {
		if len(w) > 1024 {
			w = w[:1024]
		}
		failed, why = append(failed, id), append(why, w)
	}
	// A snapshot that failed leaves the desired state: the host is told again, and forgets it.
	var failedNow int
	err := r.Tx.QueryRow(ctx, `WITH mine AS (
			SELECT s.id FROM compute.vps_snapshots s JOIN compute.vps_instances i ON i.id = s.instance_id
			WHERE i.id::text = $1 AND i.node_id = $2 AND s.deleted_at IS NULL),
		errs AS (SELECT * FROM unnest($4::text[], $5::text[]) AS e(id, why)),
		pending AS (
			UPDATE compute.vps_snapshots s SET status = CASE WHEN e.why IS NOT NULL THEN 'failed' ELSE 'ready' END, status_detail = coalesce(e.why, '')
			FROM mine LEFT JOIN errs e ON e.id = mine.id::text
			WHERE s.id = mine.id AND s.status = 'pending' AND (s.id::text = ANY($3) OR e.why IS NOT NULL) RETURNING s.status),
		restores AS ( -- a ready one the host could not restore: said in its detail
			UPDATE compute.vps_snapshots s SET status_detail = e.why FROM mine JOIN errs e ON e.id = mine.id::text
			WHERE s.id = mine.id AND s.status = 'ready' AND s.status_detail <> e.why RETURNING 1)
		SELECT count(*) FROM pending WHERE status = 'failed'`, // restores runs unread, as a data-modifying WITH does
		st.ID, r.NodeID, st.Snapshots, failed, why).Scan(&failedNow)
	if err != nil || failedNow == 0 {
		return err
	}
	return r.Runtime.Nodes.BumpDesired(ctx, r.Tx, r.NodeID)
}
