package releases

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/internal/lib/tufrepo"
	"github.com/better-compute/compute/postgres"
)

var (
	versionedRE = regexp.MustCompile(`^([1-9][0-9]{0,17})\.(root|snapshot|targets)\.json$`)
	targetRE    = regexp.MustCompile(`^([0-9a-f]{64})\.([A-Za-z0-9._-]{1,128})$`)
)

// NodeFiles serves the repository to nodes, as go-tuf's updater fetches it: GET
// tufrepo.MetadataPath+{timestamp.json, N.root.json, N.snapshot.json, N.targets.json} and
// tufrepo.TargetsPath+<sha256>.<target>. What it serves needs no trust in this server: the
// node verifies all of it. The caller mounts it behind the gateway's node authentication.
func NodeFiles(db *postgres.DB) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "the release repository is read with GET", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Cache-Control", "no-store")
		if name, ok := strings.CutPrefix(r.URL.Path, tufrepo.MetadataPath); ok {
			serveMetadata(w, r, db, name)
			return
		}
		if name, ok := strings.CutPrefix(r.URL.Path, tufrepo.TargetsPath); ok {
			serveTarget(w, r, db, name)
			return
		}
		http.NotFound(w, r)
	})
}

func serveMetadata(w http.ResponseWriter, r *http.Request, db *postgres.DB, name string) {
	ctx := r.Context()
	var body []byte
	var err error
	if name == tufrepo.Timestamp+".json" {
		var s stored
		var ok bool
		if s, ok, err = latest(ctx, db.Pool, tufrepo.Timestamp); err == nil && !ok {
			err = pgx.ErrNoRows
		}
		body = s.Body
	} else if m := versionedRE.FindStringSubmatch(name); m != nil {
		v, _ := strconv.ParseInt(m[1], 10, 64)
		err = db.Pool.QueryRow(ctx, `SELECT body FROM compute.release_metadata WHERE role = $1 AND version = $2`, m[2], v).Scan(&body)
	} else {
		http.NotFound(w, r)
		return
	}
	if errors.Is(err, pgx.ErrNoRows) {
		http.NotFound(w, r)
		return
	}
	if err != nil {
		http.Error(w, "the release repository is unavailable", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	_, _ = w.Write(body)
}

// serveTarget streams a published build by its hash, a few chunks at a time.
func serveTarget(w http.ResponseWriter, r *http.Request, db *postgres.DB, name string) {
	m := targetRE.FindStringSubmatch(name)
	if m == nil {
		http.NotFound(w, r)
		return
	}
	ctx := r.Context()
	var length int64
	err := db.Pool.QueryRow(ctx, `SELECT length FROM compute.release_builds WHERE sha256 = $1 AND target = $2`, m[1], m[2]).Scan(&length)
	if errors.Is(err, pgx.ErrNoRows) {
		http.NotFound(w, r)
		return
	}
	if err != nil {
		http.Error(w, "the release repository is unavailable", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(length, 10))
	if r.Method == http.MethodHead {
		return
	}
	_ = streamBlob(ctx, db, m[1], w)
}

// streamBlob writes a blob's chunks in order, eight at a time.
func streamBlob(ctx context.Context, db *postgres.DB, sum string, w http.ResponseWriter) error {
	for next := 0; ; {
		rows, err := db.Pool.Query(ctx, `SELECT n, data FROM compute.release_blob_chunks WHERE sha256 = $1 AND n >= $2 ORDER BY n LIMIT 8`, sum, next)
		if err != nil {
			return err
		}
		got := 0
		for rows.Next() {
			var n int
			var data []byte
			if err := rows.Scan(&n, &data); err != nil {
				rows.Close()
				return err
			}
			if n != next {
				rows.Close()
				return fmt.Errorf("releases: blob %s lacks chunk %d", sum, next)
			}
			if _, err := w.Write(data); err != nil {
				rows.Close()
				return err
			}
			next++
			got++
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if got < 8 {
			return nil
		}
	}
}
