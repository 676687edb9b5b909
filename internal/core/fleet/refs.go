package fleet

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/postgres"
)

// NodeIDIn returns the id of the node ref (an id or a name) in pool, not retired, or a
// not_found error.
func NodeIDIn(ctx context.Context, q postgres.Querier, pool, ref string) (string, error) {
	var id string
	var err error
	if IsID(ref) {
		err = q.QueryRow(ctx, `SELECT id::text FROM compute.nodes WHERE pool_id = $1 AND id = $2 AND state <> 'retired'`, pool, ref).Scan(&id)
	} else {
		err = q.QueryRow(ctx, `SELECT id::text FROM compute.nodes WHERE pool_id = $1 AND name = $2 AND state <> 'retired'`, pool, strings.ToLower(ref)).Scan(&id)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return "", api.NotFound("node", ref)
	}
	return id, err
}
