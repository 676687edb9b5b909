package postgres

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"slices"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
)

// MigrationSet is the versioned SQL one package or module owns: goose SQL files
// (NNNNN_name.sql with -- +goose Up / Down sections) at the root of FS. Its applied versions are
// kept in Schema.goose_<Name>.
type MigrationSet struct {
	Name   string // unique among the sets, e.g. "fleet"
	Schema string // the schema the set's version table lives in; created when missing
	FS     fs.FS
}

//go:embed migrations/*.sql
var coreFS embed.FS

// Core is the set every other one builds on: the compute schema, compute_now() and btree_gist.
var Core = EmbeddedMigrations("core", "compute", coreFS)

// EmbeddedMigrations is the set of the .sql files in the migrations/ folder of fsys, as a
// package embeds them (//go:embed migrations/*.sql).
func EmbeddedMigrations(name, schema string, fsys fs.FS) MigrationSet {
	sub, err := fs.Sub(fsys, "migrations")
	if err != nil {
		panic(fmt.Sprintf("postgres: migrations of %s: %v", name, err))
	}
	return MigrationSet{Name: name, Schema: schema, FS: sub}
}

// migrationLock is the advisory lock key that serialises migrations of all processes.
const migrationLock int64 = 0x62635f6d6967 // "bc_mig"

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,40}$`)

func (s MigrationSet) check() error {
	if !identRE.MatchString(s.Name) || !identRE.MatchString(s.Schema) {
		return fmt.Errorf("postgres: migration set %q (schema %q): name and schema must be lowercase SQL identifiers", s.Name, s.Schema)
	}
	if s.FS == nil {
		return fmt.Errorf("postgres: migration set %q has no files", s.Name)
	}
	return nil
}

func (s MigrationSet) table() string { return s.Schema + ".goose_" + s.Name }

// CheckSets validates a list of sets: well-formed and with unique names.
func CheckSets(sets []MigrationSet) error {
	seen := map[string]bool{}
	for _, s := range sets {
		if err := s.check(); err != nil {
			return err
		}
		if seen[s.Name] {
			return fmt.Errorf("postgres: two migration sets are named %q", s.Name)
		}
		seen[s.Name] = true
	}
	return nil
}

// Migrate applies every pending migration of sets, in order, under one advisory lock, so that
// several processes starting at once apply each migration exactly once.
func Migrate(ctx context.Context, db *DB, sets ...MigrationSet) error {
	return withLock(ctx, db, sets, func(p *goose.Provider) error {
		_, err := p.Up(ctx)
		return err
	})
}

// MigrateDown rolls back every migration of sets, last set first. It is for tests and tools.
func MigrateDown(ctx context.Context, db *DB, sets ...MigrationSet) error {
	rev := slices.Clone(sets)
	slices.Reverse(rev)
	return withLock(ctx, db, rev, func(p *goose.Provider) error {
		_, err := p.DownTo(ctx, 0)
		return err
	})
}

// Pending reports whether any set has a migration not yet applied.
func Pending(ctx context.Context, db *DB, sets ...MigrationSet) (bool, error) {
	pending := false
	err := withLock(ctx, db, sets, func(p *goose.Provider) error {
		has, err := p.HasPending(ctx)
		pending = pending || has
		return err
	})
	return pending, err
}

func withLock(ctx context.Context, db *DB, sets []MigrationSet, run func(*goose.Provider) error) (err error) {
	if err := CheckSets(sets); err != nil {
		return err
	}
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("postgres: migrate: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_catalog.pg_advisory_lock($1)", migrationLock); err != nil {
		return fmt.Errorf("postgres: migrate: take the migration lock: %w", err)
	}
	defer func() {
		// A fresh context: the caller's may be cancelled, and the lock must not outlive us.
		if _, uerr := conn.Exec(context.WithoutCancel(ctx), "SELECT pg_catalog.pg_advisory_unlock($1)", migrationLock); uerr != nil {
			conn.Conn().Close(context.Background())
			err = errors.Join(err, uerr)
		}
	}()
	sqlDB := stdlib.OpenDBFromPool(db.Pool)
	defer sqlDB.Close()
	for _, s := range sets {
		if _, err := conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+s.Schema); err != nil {
			return fmt.Errorf("postgres: migrate %s: create schema %s: %w", s.Name, s.Schema, err)
		}
		p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, s.FS,
			goose.WithTableName(s.table()), goose.WithDisableGlobalRegistry(true))
		if err != nil {
			return fmt.Errorf("postgres: migrate %s: %w", s.Name, err)
		}
		if err := run(p); err != nil {
			return fmt.Errorf("postgres: migrate %s: %w", s.Name, err)
		}
	}
	return nil
}

// Hash is a digest of the sets' names and files, so that a template database can be reused for
// exactly the schema it was built from.
func Hash(sets ...MigrationSet) (string, error) {
	h := sha256.New()
	for _, s := range sets {
		fmt.Fprintf(h, "set %s %s\n", s.Name, s.Schema)
		err := fs.WalkDir(s.FS, ".", func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := fs.ReadFile(s.FS, path)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, "file %s %d\n", path, len(b))
			h.Write(b)
			return nil
		})
		if err != nil {
			return "", fmt.Errorf("postgres: hash migration set %s: %w", s.Name, err)
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
