package iam

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestUnavailable(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want bool
	}{
		{errors.New("iam: usage needs the time it occurred"), false},
		{fmt.Errorf("iam: record: %w", &pgconn.PgError{Code: "23503"}), false}, // a foreign key: bad input
		{fmt.Errorf("iam: record: %w", &pgconn.PgError{Code: "22P02"}), false},
		{fmt.Errorf("iam: record: %w", &pgconn.PgError{Code: "57P01"}), true}, // admin shutdown
		{fmt.Errorf("iam: record: %w", &pgconn.PgError{Code: "40001"}), true}, // serialization
		{fmt.Errorf("iam: %w", context.DeadlineExceeded), true},
	} {
		if got := unavailable(c.err); got != c.want {
			t.Errorf("unavailable(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
