package releases

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/core/envelope"
	"github.com/better-compute/compute/modules"
)

// A build is uploaded in two steps: releases.upload (one IAM decision, in the root tenant) gives
// a ticket naming the bytes' length and SHA-256, sealed with the secret; a PUT of the bytes with
// the ticket stores them, once they hash to what it names. The bytes are content-addressed: what
// they are (a version's build for a platform) is said only by the signed targets that list them.

const ticketPurpose = "release-upload"

// chunkSize is the size of the chunks a build is stored and served in.
const chunkSize = 1 << 20

type ticket struct {
	SHA256  string `json:"s"`
	Length  int64  `json:"l"`
	Expires int64  `json:"e"` // Unix seconds
	By      string `json:"b"`
}

func upload(ctx context.Context, c *modules.Call, in api.UploadBuild) (api.UploadTicket, error) {
	if err := rootOnly(c); err != nil {
		return api.UploadTicket{}, err
	}
	var length int64
	err := c.Tx.QueryRow(ctx, `SELECT length FROM compute.release_blobs WHERE sha256 = $1`, in.SHA256).Scan(&length)
	switch {
	case err == nil && length == in.Length:
		return api.UploadTicket{Held: true}, nil
	case err == nil:
		return api.UploadTicket{}, api.InvalidField("length", "bytes of sha256 %s are held with %d bytes, not %d", in.SHA256, length, in.Length)
	case !errors.Is(err, pgx.ErrNoRows):
		return api.UploadTicket{}, err
	}
	at, err := now(ctx, c.Tx)
	if err != nil {
		return api.UploadTicket{}, err
	}
	exp := at.Add(api.UploadTicketTTL).UTC().Truncate(time.Second)
	b, _ := json.Marshal(ticket{SHA256: in.SHA256, Length: in.Length, Expires: exp.Unix(), By: c.Principal.ID})
	sealed, err := c.Runtime.Secrets.Seal(ticketPurpose, b)
	if err != nil {
		return api.UploadTicket{}, err
	}
	t := base64.RawURLEncoding.EncodeToString(sealed)
	return api.UploadTicket{Ticket: t, URL: api.BasePath + api.ReleaseUploadPath + "?ticket=" + t, ExpiresAt: &exp}, nil
}

// UploadHandler serves PUT BasePath+ReleaseUploadPath?ticket=…: the bytes of a build, stored
// once they are exactly what the ticket names.
func UploadHandler(rt *modules.Runtime) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPut {
			w.Header().Set("Allow", http.MethodPut)
			envelope.WriteError(w, http.StatusMethodNotAllowed, &api.Error{Code: api.CodeInvalidArgument,
				Message: r.Method + " is not allowed: a build is uploaded with PUT " + api.BasePath + api.ReleaseUploadPath + "?ticket=…",
				Details: map[string]any{"reason": "method_not_allowed"}})
			return
		}
		t, err := openTicket(r.Context(), rt, r.URL.Query().Get("ticket"))
		if err != nil {
			envelope.WriteError(w, 0, err)
			return
		}
		held, err := store(r.Context(), rt, t, http.MaxBytesReader(w, r.Body, t.Length+1))
		if err != nil {
			envelope.WriteError(w, 0, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"sha256": t.SHA256, "length": t.Length, "held": held})
	})
}

func openTicket(ctx context.Context, rt *modules.Runtime, s string) (ticket, error) {
	var t ticket
	bad := &api.Error{Code: api.CodeUnauthenticated, Message: "not an upload ticket of this control plane, or expired: ask releases.upload for another",
		Details: map[string]any{"reason": "ticket"}}
	sealed, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || s == "" {
		return t, bad
	}
	b, err := rt.Secrets.Open(ticketPurpose, sealed)
	if err != nil || json.Unmarshal(b, &t) != nil {
		return t, bad
	}
	at, err := rt.Clock.Now(ctx, rt.DB.Pool)
	if err != nil {
		return t, err
	}
	if at.Unix() >= t.Expires {
		return t, bad
	}
	return t, nil
}

// store writes body as the blob t names, in one transaction, and reports whether it was held
// already (another upload stored it first).
func store(ctx context.Context, rt *modules.Runtime, t ticket, body io.Reader) (held bool, err error) {
	err = pgx.BeginFunc(ctx, rt.DB.Pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO compute.release_blobs (sha256, length, created_by) VALUES ($1, $2, $3) ON CONFLICT (sha256) DO NOTHING`,
			t.SHA256, t.Length, t.By)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			held = true
			return nil
		}
		h := sha256.New()
		buf := make([]byte, chunkSize)
		var n int64
		for i := 0; ; i++ {
			k, err := io.ReadFull(body, buf)
			if k > 0 {
				h.Write(buf[:k])
				n += int64(k)
				if n > t.Length {
					return api.Errorf(api.CodeInvalidArgument, "the body is longer than the ticket's %d bytes", t.Length).With("reason", "length")
				}
				if _, err := tx.Exec(ctx, `INSERT INTO compute.release_blob_chunks (sha256, n, data) VALUES ($1, $2, $3)`, t.SHA256, i, buf[:k]); err != nil {
					return err
				}
			}
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				break
			}
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				return api.Errorf(api.CodeInvalidArgument, "the body is longer than the ticket's %d bytes", t.Length).With("reason", "length")
			}
			if err != nil {
				return fmt.Errorf("releases: read the upload: %w", err)
			}
		}
		if n != t.Length {
			return api.Errorf(api.CodeInvalidArgument, "the body is %d bytes; the ticket names %d", n, t.Length).With("reason", "length")
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != t.SHA256 {
			return api.Errorf(api.CodeInvalidArgument, "the body's SHA-256 is %s; the ticket names %s", got, t.SHA256).With("reason", "sha256")
		}
		return nil
	})
	return held, err
}
