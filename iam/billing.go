package iam

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/postgres"
)

var meterRE = regexp.MustCompile(`^[a-z0-9_]+(\.[a-z0-9_]+)+$`)

// ValidMeter reports whether key may name a meter: lowercase words joined by dots (gpu.h100.hours).
func ValidMeter(key string) bool { return meterRE.MatchString(key) }

// EnsureMeters implements Biller.
func (l *Local) EnsureMeters(ctx context.Context, meters []Meter) error {
	for _, m := range meters {
		if !ValidMeter(m.Key) {
			return fmt.Errorf("iam: meter %q: keys are lowercase words joined by dots, e.g. gpu.h100.hours", m.Key)
		}
		if _, err := l.db.Pool.Exec(ctx, `INSERT INTO iam.meters (key, unit, description) VALUES ($1, $2, $3)
			ON CONFLICT (key) DO NOTHING`, m.Key, m.Unit, m.Description); err != nil {
			return fmt.Errorf("iam: meter %s: %w", m.Key, err)
		}
	}
	return nil
}

// RecordUsage implements Biller.
func (l *Local) RecordUsage(ctx context.Context, u Usage) (Receipt, error) {
	switch {
	case u.IdempotencyKey == "":
		return Receipt{}, errors.New("iam: usage needs an idempotency key")
	case u.TenantID == "":
		return Receipt{}, errors.New("iam: usage needs a tenant")
	case math.IsNaN(u.Quantity) || math.IsInf(u.Quantity, 0) || u.Quantity < 0:
		return Receipt{}, fmt.Errorf("iam: usage quantity %v is not a non-negative number", u.Quantity)
	case u.OccurredAt.IsZero():
		return Receipt{}, errors.New("iam: usage needs the time it occurred")
	}
	if u.Tags == nil {
		u.Tags = map[string]string{}
	}
	var r Receipt
	err := l.db.Pool.QueryRow(ctx, `INSERT INTO iam.usage (id, tenant_id, meter, quantity, identity_id, tags, occurred_at, idempotency_key)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (idempotency_key) DO NOTHING RETURNING id, recorded_at`,
		newID("use"), u.TenantID, u.Meter, u.Quantity, u.IdentityID, u.Tags, u.OccurredAt, u.IdempotencyKey).Scan(&r.ID, &r.RecordedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		// A repeat answers the first receipt, but only the same tenant's: another tenant's usage
		// under the same key is neither shown nor counted as this one.
		r.Duplicate = true
		err = l.db.Pool.QueryRow(ctx, `SELECT id, recorded_at FROM iam.usage WHERE idempotency_key = $1 AND tenant_id = $2`,
			u.IdempotencyKey, u.TenantID).Scan(&r.ID, &r.RecordedAt)
		if errors.Is(err, pgx.ErrNoRows) {
			return Receipt{}, fmt.Errorf("iam: usage idempotency key %q is already used; choose another", u.IdempotencyKey)
		}
	}
	switch postgres.ErrorCode(err) {
	case postgres.ForeignKeyViolation:
		return Receipt{}, fmt.Errorf("iam: usage of tenant %q on meter %q: tenant or meter %w", u.TenantID, u.Meter, ErrNotFound)
	case "":
	default:
		return Receipt{}, fmt.Errorf("iam: record usage: %w", err)
	}
	return r, err
}

// UsageTotal sums the usage recorded for a tenant on a meter. It is for tests and reports.
func (l *Local) UsageTotal(ctx context.Context, tenantID, meter string) (float64, int, error) {
	var total float64
	var n int
	err := l.db.Pool.QueryRow(ctx, `SELECT coalesce(sum(quantity), 0)::float8, count(*) FROM iam.usage WHERE tenant_id = $1 AND meter = $2`,
		tenantID, meter).Scan(&total, &n)
	return total, n, err
}

// TenantPath implements Port.
func (l *Local) TenantPath(ctx context.Context, tenant string) ([]string, error) {
	path, gen, ok := l.pathCache.get(tenant)
	if ok {
		return path, nil
	}
	path, err := l.readTenantPath(ctx, tenant)
	if err == nil && len(path) > 0 {
		l.pathCache.put(tenant, path, gen, time.Time{})
	}
	return path, err
}

func (l *Local) readTenantPath(ctx context.Context, tenant string) ([]string, error) {
	rows, err := l.db.Pool.Query(ctx, `
		WITH RECURSIVE up (id, parent_id, depth) AS (
		  SELECT id, parent_id, 0 FROM iam.tenants WHERE id = $1
		  UNION ALL
		  SELECT t.id, t.parent_id, up.depth + 1 FROM iam.tenants t JOIN up ON t.id = up.parent_id
		)
		SELECT id FROM up ORDER BY depth`, tenant)
	if err != nil {
		return nil, fmt.Errorf("iam: tenant path: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
