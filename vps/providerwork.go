package vps

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/better-compute/compute/modules"
	"github.com/better-compute/compute/netpolicy"
	"github.com/better-compute/compute/vps/provider"
)

// Provider pools' background work, on River: a job per create, delete and reinstall (retried
// with backoff: a provider's 5xx or a lost connection is tried again, a refusal is not), and a
// reconciliation job per account, enqueued by the module's worker every
// Options.ProviderReconcileEvery, that lists the account's servers and compares them with its
// instances.

// ProviderQueue is the River queue of provider pools' jobs.
const ProviderQueue = "vps-providers"

// Retries of provider jobs.
const (
	ProviderMaxAttempts = 12               // about 20 minutes of retries
	ProviderRetryMax    = 5 * time.Minute  // the longest wait between attempts
	ProviderJobTimeout  = 15 * time.Minute // one attempt: a Proxmox clone copies a disk
)

type providerCreateArgs struct {
	Instance string `json:"instance"`
}

func (providerCreateArgs) Kind() string { return "vps.provider.create" }
func (providerCreateArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: ProviderQueue, MaxAttempts: ProviderMaxAttempts}
}

// providerDeleteArgs deletes an instance's server: Server when set (the reconciler's and a late
// create's), else the one it recorded, else the one of its name.
type providerDeleteArgs struct {
	Instance string `json:"instance"`
	Server   string `json:"server,omitempty"`
}

func (providerDeleteArgs) Kind() string { return "vps.provider.delete" }
func (providerDeleteArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: ProviderQueue, MaxAttempts: ProviderMaxAttempts, UniqueOpts: oneAtATime}
}

type providerReinstallArgs struct {
	Instance string `json:"instance"`
	Image    string `json:"image"`
}

func (providerReinstallArgs) Kind() string { return "vps.provider.reinstall" }
func (providerReinstallArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: ProviderQueue, MaxAttempts: ProviderMaxAttempts}
}

type providerReconcileArgs struct {
	Account string `json:"account"`
}

func (providerReconcileArgs) Kind() string { return "vps.provider.reconcile" }
func (providerReconcileArgs) InsertOpts() river.InsertOpts {
	// A failed round is not retried: the next one comes anyway.
	return river.InsertOpts{Queue: ProviderQueue, MaxAttempts: 1, UniqueOpts: oneAtATime}
}

// oneAtATime keeps one job of the same arguments queued or running: a round that finds one
// adds none.
var oneAtATime = river.UniqueOpts{ByArgs: true, ByState: []rivertype.JobState{rivertype.JobStateAvailable, rivertype.JobStatePending,
	rivertype.JobStateRunning, rivertype.JobStateScheduled}}

// providerWorker is the River worker of one kind of provider job.
type providerWorker[T river.JobArgs] struct {
	river.WorkerDefaults[T]
	m    *Module
	rt   *modules.Runtime
	work func(ctx context.Context, w *work, j *river.Job[T]) error
}

func (w *providerWorker[T]) Timeout(*river.Job[T]) time.Duration { return ProviderJobTimeout }

// NextRetry doubles from a second up to ProviderRetryMax, ±20%.
func (w *providerWorker[T]) NextRetry(j *river.Job[T]) time.Time {
	d := min(time.Second<<min(max(j.Attempt-1, 0), 20), ProviderRetryMax)
	return time.Now().Add(time.Duration(float64(d) * (0.8 + 0.4*rand.Float64())))
}

func (w *providerWorker[T]) Work(ctx context.Context, j *river.Job[T]) error {
	return w.work(ctx, &work{m: w.m, rt: w.rt, attempt: j.Attempt, last: j.Attempt >= j.MaxAttempts}, j)
}

func (m *Module) registerProviderWork(r *modules.Registry) {
	r.JobQueue(modules.JobQueue{Name: ProviderQueue, MaxWorkers: 10, AddWorkers: func(ws *river.Workers, rt *modules.Runtime) error {
		return errors.Join(
			river.AddWorkerSafely(ws, &providerWorker[providerCreateArgs]{m: m, rt: rt, work: func(ctx context.Context, w *work, j *river.Job[providerCreateArgs]) error {
				return w.create(ctx, j.Args.Instance)
			}}),
			river.AddWorkerSafely(ws, &providerWorker[providerDeleteArgs]{m: m, rt: rt, work: func(ctx context.Context, w *work, j *river.Job[providerDeleteArgs]) error {
				return w.delete(ctx, j.Args)
			}}),
			river.AddWorkerSafely(ws, &providerWorker[providerReinstallArgs]{m: m, rt: rt, work: func(ctx context.Context, w *work, j *river.Job[providerReinstallArgs]) error {
				return w.reinstall(ctx, j.Args)
			}}),
			river.AddWorkerSafely(ws, &providerWorker[providerReconcileArgs]{m: m, rt: rt, work: func(ctx context.Context, w *work, j *river.Job[providerReconcileArgs]) error {
				return w.reconcile(ctx, j.Args.Account)
			}}),
		)
	}})
	r.Worker(modules.Worker{Name: "vps-providers", Modes: []string{"worker"}, Run: func(ctx context.Context, rt *modules.Runtime) error {
		return modules.Every(ctx, m.opts.ProviderReconcileEvery, func() error { return enqueueReconciles(ctx, rt) })
	}})
}

// enqueueReconciles enqueues a reconciliation of every account; one already queued or running
// is left to finish.
func enqueueReconciles(ctx context.Context, rt *modules.Runtime) error {
	return rt.DB.Tx(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT id::text FROM compute.vps_provider_accounts ORDER BY id`)
		if err != nil {
			return err
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		for _, id := range ids {
			if _, err := rt.Jobs.InsertTx(ctx, tx, providerReconcileArgs{Account: id}, nil); err != nil {
				return err
			}
		}
		return nil
	})
}

// work is one attempt of a provider job.
type work struct {
	m       *Module
	rt      *modules.Runtime
	attempt int
	last    bool // no retry follows a failure of this attempt
}

// target is an instance as a job reads it, with its account opened.
type target struct {
	ProviderInstance
	serverAt   *time.Time
	spec       provider.Spec
	p          provider.Provider
	account    provider.Account
	hasAccount bool
}

// load reads an instance and its account, the token and user data opened; nil when the
// instance is not there.
func (w *work) load(ctx context.Context, id string) (*target, error) {
	var t target
	var accountID, kind, endpoint string
	var token, userData []byte
	var options map[string]string
	var vcpus, memGiB, diskGiB int
	err := w.rt.DB.Pool.QueryRow(ctx, `SELECT `+providerInstanceColumns+`, i.server_at, i.vcpus, i.memory_gib, i.disk_gib, i.user_data,
			coalesce(a.id::text, ''), coalesce(a.kind, ''), coalesce(a.endpoint, ''), a.token, coalesce(a.options, '{}')
		FROM compute.vps_provider_instances i LEFT JOIN compute.vps_provider_accounts a ON a.id = i.account_id WHERE i.id = $1`, id).
		Scan(&t.ID, &t.TenantID, &t.Name, &t.Provider, &t.ProviderID, &t.Kind, &t.Flavor, &t.ServerType, &t.Image, &t.Location,
			&t.SSHKeys, &t.UserDataSet, &t.ServerID, &t.IPv4, &t.IPv6, &t.Status, &t.StatusDetail, &t.StatusAt, &t.DeletedAt, &t.DeletedReason,
			&t.Labels, &t.CreatedBy, &t.CreatedAt, &t.serverAt, &vcpus, &memGiB, &diskGiB, &userData, &accountID, &kind, &endpoint, &token, &options)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	t.ServerName = serverName(t.ID)
	t.spec = provider.Spec{Name: t.ServerName, Type: t.ServerType, VCPUs: vcpus, MemoryMiB: memGiB << 10, DiskGiB: diskGiB, Image: t.Image,
		Location: t.Location, SSHKeys: t.SSHKeys, Labels: map[string]string{LabelInstance: t.ID}}
	if accountID == "" {
		return &t, nil
	}
	if t.p, err = ProviderDriver(w.rt.Registry, kind); err != nil {
		return nil, fmt.Errorf("vps: provider instance %s's account: %w", id, err)
	}
	plain, err := w.rt.Secrets.Open(tokenPurpose(accountID), token)
	if err != nil {
		return nil, fmt.Errorf("vps: open provider account %s's token: %w", accountID, err)
	}
	if userData != nil {
		ud, err := w.rt.Secrets.Open(userDataPurpose(id), userData)
		if err != nil {
			return nil, fmt.Errorf("vps: open provider instance %s's user data: %w", id, err)
		}
		t.spec.UserData = string(ud)
	}
	t.account = provider.Account{Endpoint: endpoint, Token: string(plain), Options: options, Outbound: w.rt.Outbound}
	t.hasAccount = true
	return &t, nil
}

// setStatus records a status and its event, for a live instance (or, with deleted, a deleting
// one), when it changed.
func (w *work) setStatus(ctx context.Context, tx pgx.Tx, t *target, status, detail string) error {
	if len(detail) > 1024 {
		detail = detail[:1024]
	}
	tag, err := tx.Exec(ctx, `UPDATE compute.vps_provider_instances SET status = $2, status_detail = $3, status_at = compute.compute_now()
		WHERE id = $1 AND (status <> $2 OR status_detail <> $3) AND status <> 'deleted'`, t.ID, status, detail)
	if err != nil || tag.RowsAffected() == 0 {
		return err
	}
	return w.rt.Events.Emit(ctx, tx, modules.Event{Type: EventInstanceStatus, TenantID: t.TenantID, Subject: t.ID,
		Data: map[string]any{"name": t.Name, "status": status, "detail": detail, "provider": t.Provider}})
}

// failed records a failed attempt: a refusal (or the last attempt) puts the instance in error
// and ends the job, another failure is retried.
func (w *work) failed(ctx context.Context, t *target, what string, err error) error {
	// The detail the tenant reads is the provider's summary (provider.Account); the whole is the operator's.
	w.rt.Logger.WarnContext(ctx, "vps: a provider job failed", "instance", t.ID, "what", what, "attempt", w.attempt, "error", netpolicy.Detail(err))
	final := errors.Is(err, provider.ErrUnauthorized) || errors.Is(err, provider.ErrInvalid) || w.last
	status, detail := t.Status, fmt.Sprintf("%s failed (attempt %d, retrying): %v", what, w.attempt, err)
	if final {
		status, detail = ProviderError, fmt.Sprintf("%s failed: %v", what, err)
	}
	if t.DeletedAt != nil {
		status = ProviderDeleting // a deletion stays one; the reconciler enqueues it again while the server is listed
	}
	if serr := w.rt.DB.Tx(ctx, func(tx pgx.Tx) error { return w.setStatus(ctx, tx, t, status, detail) }); serr != nil {
		return errors.Join(err, serr)
	}
	if final && !w.last {
		return river.JobCancel(err)
	}
	return err
}

// create makes an instance's server. A server of its name is one an earlier attempt made (the
// name holds the instance's id): it is taken as the instance's.
func (w *work) create(ctx context.Context, id string) error {
	t, err := w.load(ctx, id)
	if err != nil || t == nil || t.DeletedAt != nil || t.Status != ProviderPending {
		return err // gone, deleted before it was made, or made already
	}
	if !t.hasAccount {
		return w.failed(ctx, t, "create", fmt.Errorf("its provider account was deleted: %w", provider.ErrInvalid))
	}
	srv, err := t.p.Create(ctx, t.account, t.spec)
	if errors.Is(err, provider.ErrExists) {
		srv, err = byName(ctx, t)
	}
	if err != nil {
		return w.failed(ctx, t, "create", err)
	}
	return w.rt.DB.Tx(ctx, func(tx pgx.Tx) error {
		var deleted bool
		if err := tx.QueryRow(ctx, `UPDATE compute.vps_provider_instances SET server_id = $2, server_at = compute.compute_now(), ipv4 = $3, ipv6 = $4
			WHERE id = $1 RETURNING deleted_at IS NOT NULL`, t.ID, srv.ID, srv.IPv4, srv.IPv6).Scan(&deleted); err != nil {
			return err
		}
		if deleted {
			// Deleted while its server was being made: the server goes too.
			_, err := w.rt.Jobs.InsertTx(ctx, tx, providerDeleteArgs{Instance: t.ID, Server: srv.ID}, nil)
			return err
		}
		return w.setStatus(ctx, tx, t, instanceStatus(srv.Status), "")
	})
}

// byName finds the server an instance's name names.
func byName(ctx context.Context, t *target) (provider.Server, error) {
	servers, err := t.p.List(ctx, t.account, t.ServerName)
	if err != nil {
		return provider.Server{}, err
	}
	for _, s := range servers {
		if s.Name == t.ServerName {
			return s, nil
		}
	}
	return provider.Server{}, fmt.Errorf("the provider says server %s exists but lists none of that name", t.ServerName)
}

func instanceStatus(s string) string {
	switch s {
	case provider.StatusCreating:
		return ProviderCreating
	case provider.StatusRunning:
		return ProviderRunning
	case provider.StatusStopped:
		return ProviderStopped
	}
	return ProviderOther
}

// delete deletes an instance's server and, once the provider no longer has it, records the
// instance deleted.
func (w *work) delete(ctx context.Context, args providerDeleteArgs) error {
	t, err := w.load(ctx, args.Instance)
	if err != nil || t == nil || (t.Status == ProviderDeleted && args.Server == "") {
		return err
	}
	server := args.Server
	if server == "" {
		server = t.ServerID
	}
	if !t.hasAccount {
		server = "" // the account is gone (only once no server could remain): nothing to ask
	} else if server == "" {
		// Never recorded: the create job has not made it, or made it and died before recording.
		s, err := byName(ctx, t)
		if err == nil {
			server = s.ID
		}
	}
	if server != "" {
		if err := t.p.Delete(ctx, t.account, server); err != nil {
			return w.failed(ctx, t, "delete server "+server, err)
		}
	}
	return w.rt.DB.Tx(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE compute.vps_provider_instances SET status = 'deleted', status_detail = '', status_at = compute.compute_now()
			WHERE id = $1 AND deleted_at IS NOT NULL AND status <> 'deleted'`, t.ID)
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		return w.rt.Events.Emit(ctx, tx, modules.Event{Type: EventInstanceStatus, TenantID: t.TenantID, Subject: t.ID,
			Data: map[string]any{"name": t.Name, "status": ProviderDeleted, "detail": "", "provider": t.Provider}})
	})
}

// reinstall puts an image on an instance's server anew.
func (w *work) reinstall(ctx context.Context, args providerReinstallArgs) error {
	t, err := w.load(ctx, args.Instance)
	if err != nil || t == nil || t.DeletedAt != nil || t.ServerID == "" || !t.hasAccount {
		return err
	}
	if err := t.p.Reinstall(ctx, t.account, t.ServerID, args.Image); err != nil {
		return w.failed(ctx, t, "reinstall", err)
	}
	// Creating until the reconciler lists the server running again.
	return w.rt.DB.Tx(ctx, func(tx pgx.Tx) error {
		return w.setStatus(ctx, tx, t, ProviderCreating, "reinstalled with "+args.Image)
	})
}

// reconcile lists an account's servers and compares them with its instances: a server gone
// makes its instance lost; a server of a deleted instance is deleted again; a server with our
// mark and no instance is reported once (provider.server_unknown).
func (w *work) reconcile(ctx context.Context, accountID string) error {
	var kind, endpoint, tenant string
	var token []byte
	var options map[string]string
	var unknown []string
	err := w.rt.DB.Pool.QueryRow(ctx, `SELECT kind, endpoint, token, options, unknown_servers, tenant_id FROM compute.vps_provider_accounts WHERE id = $1`,
		accountID).Scan(&kind, &endpoint, &token, &options, &unknown, &tenant)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return err
	}
	p, err := ProviderDriver(w.rt.Registry, kind)
	if err != nil {
		return fmt.Errorf("vps: provider account %s: %w", accountID, err)
	}
	plain, err := w.rt.Secrets.Open(tokenPurpose(accountID), token)
	if err != nil {
		return fmt.Errorf("vps: open provider account %s's token: %w", accountID, err)
	}
	listedAt, err := w.rt.Clock.Now(ctx, w.rt.DB.Pool)
	if err != nil {
		return err
	}
	servers, err := p.List(ctx, provider.Account{Endpoint: endpoint, Token: string(plain), Options: options, Outbound: w.rt.Outbound}, ServerPrefix)
	if err != nil {
		w.rt.Logger.WarnContext(ctx, "vps: a provider account's reconciliation failed", "account", accountID, "error", netpolicy.Detail(err))
		// Recorded on the account; the next round tries again.
		_, uerr := w.rt.DB.Pool.Exec(ctx, `UPDATE compute.vps_provider_accounts SET reconcile_error = $2 WHERE id = $1`, accountID, err.Error()[:min(len(err.Error()), 1024)])
		return errors.Join(err, uerr)
	}
	return w.rt.DB.Tx(ctx, func(tx pgx.Tx) error { return w.compare(ctx, tx, accountID, tenant, unknown, servers, listedAt) })
}

func (w *work) compare(ctx context.Context, tx pgx.Tx, accountID, tenant string, unknown []string, servers []provider.Server, listedAt time.Time) error {
	listed := map[string]provider.Server{}
	var ids []string // the instance ids the servers' names hold
	for _, s := range servers {
		listed[s.Name] = s
		if id, ok := strings.CutPrefix(s.Name, ServerPrefix); ok && uuid.Validate(id) == nil {
			ids = append(ids, id)
		}
	}
	rows, err := tx.Query(ctx, `SELECT `+providerInstanceColumns+`, i.server_at FROM compute.vps_provider_instances i
		WHERE (i.account_id = $1 AND i.status <> 'deleted') OR i.id::text = ANY($2) ORDER BY i.id FOR UPDATE`, accountID, ids)
	if err != nil {
		return err
	}
	ts, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*target, error) {
		var t target
		err := r.Scan(&t.ID, &t.TenantID, &t.Name, &t.Provider, &t.ProviderID, &t.Kind, &t.Flavor, &t.ServerType, &t.Image, &t.Location,
			&t.SSHKeys, &t.UserDataSet, &t.ServerID, &t.IPv4, &t.IPv6, &t.Status, &t.StatusDetail, &t.StatusAt, &t.DeletedAt, &t.DeletedReason,
			&t.Labels, &t.CreatedBy, &t.CreatedAt, &t.serverAt)
		t.ServerName = serverName(t.ID)
		return &t, err
	})
	if err != nil {
		return err
	}
	known := map[string]bool{}
	for _, t := range ts {
		known[t.ServerName] = true
		s, ok := listed[t.ServerName]
		switch {
		case t.ProviderID != accountID:
			// An instance of another account whose name this one lists: not ours to judge here.
		case t.DeletedAt != nil:
			if ok { // deleted here, still there: delete it (again)
				if _, err := w.rt.Jobs.InsertTx(ctx, tx, providerDeleteArgs{Instance: t.ID, Server: s.ID}, nil); err != nil {
					return err
				}
			}
		case t.Status == ProviderPending:
			// Its create job is the one to record it.
		case ok:
			if s.ID != t.ServerID || s.IPv4 != t.IPv4 || s.IPv6 != t.IPv6 {
				if _, err := tx.Exec(ctx, `UPDATE compute.vps_provider_instances SET server_id = $2, ipv4 = $3, ipv6 = $4,
					server_at = coalesce(server_at, compute.compute_now()) WHERE id = $1`, t.ID, s.ID, s.IPv4, s.IPv6); err != nil {
					return err
				}
			}
			if t.Status != ProviderError || t.StatusDetail == "" {
				if err := w.setStatus(ctx, tx, t, instanceStatus(s.Status), ""); err != nil {
					return err
				}
			}
		case t.ServerID != "" && t.serverAt != nil && t.serverAt.Before(listedAt) && t.Status != ProviderLost:
			if err := w.setStatus(ctx, tx, t, ProviderLost, fmt.Sprintf("server %s is gone at %s: it was not deleted by this control plane", t.ServerID, t.Kind)); err != nil {
				return err
			}
		}
	}
	var now []string
	for _, s := range servers {
		if known[s.Name] {
			continue
		}
		now = append(now, s.ID)
		if slices.Contains(unknown, s.ID) {
			continue // reported already
		}
		if err := w.rt.Events.Emit(ctx, tx, modules.Event{Type: EventProviderServerUnknown, TenantID: tenant, Subject: accountID,
			Data: map[string]any{"account": accountID, "server": s.ID, "name": s.Name}}); err != nil {
			return err
		}
	}
	if now == nil {
		now = []string{}
	}
	_, err = tx.Exec(ctx, `UPDATE compute.vps_provider_accounts SET unknown_servers = $2, reconciled_at = compute.compute_now(), reconcile_error = ''
		WHERE id = $1`, accountID, now)
	return err
}
