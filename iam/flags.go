package iam

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/postgres"
)

var flagRE = regexp.MustCompile(`^[a-z][a-z0-9._-]{0,127}$`)

// SetFlag creates or changes a boolean feature flag's default.
func (l *Local) SetFlag(ctx context.Context, key string, def bool, description string) error {
	if !flagRE.MatchString(key) {
		return fmt.Errorf("iam: flag %q: keys are lowercase letters, digits and '._-'", key)
	}
	return l.db.Tx(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO iam.flags (key, default_value, description) VALUES ($1, $2, $3)
			ON CONFLICT (key) DO UPDATE SET default_value = excluded.default_value, description = excluded.description`, key, def, description)
		if err != nil {
			return fmt.Errorf("iam: set flag %s: %w", key, err)
		}
		return l.event(ctx, tx, EventFlagSet, l.opts.RootTenantID, key, map[string]any{"default": def})
	})
}

// OverrideFlag sets a flag's value for a tenant and its descendants (unless they override it too).
func (l *Local) OverrideFlag(ctx context.Context, key, tenantID string, value bool) error {
	err := l.db.Tx(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO iam.flag_overrides (key, tenant_id, value) VALUES ($1, $2, $3)
			ON CONFLICT (key, tenant_id) DO UPDATE SET value = excluded.value`, key, tenantID, value)
		if err != nil {
			return err
		}
		return l.event(ctx, tx, EventFlagSet, tenantID, key, map[string]any{"value": value})
	})
	if postgres.ErrorCode(err) == postgres.ForeignKeyViolation {
		return fmt.Errorf("iam: flag %q or tenant %q: %w", key, tenantID, ErrNotFound)
	}
	return err
}

// Flag implements Port: the override of the nearest tenant on the path to the root, or the default.
func (l *Local) Flag(ctx context.Context, tenantID, key string) (bool, error) {
	var def bool
	err := l.db.Pool.QueryRow(ctx, `SELECT default_value FROM iam.flags WHERE key = $1`, key).Scan(&def)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, fmt.Errorf("iam: flag %q: %w", key, ErrNotFound)
	}
	if err != nil {
		return false, err
	}
	path, err := l.TenantPath(ctx, tenantID)
	if err != nil {
		return false, err
	}
	var v bool
	err = l.db.Pool.QueryRow(ctx, `SELECT value FROM iam.flag_overrides WHERE key = $1 AND tenant_id = ANY($2)
		ORDER BY array_position($2, tenant_id) LIMIT 1`, key, path).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return def, nil
	}
	return v, err
}
