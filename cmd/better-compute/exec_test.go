package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/sim"
)

// TestTunnelErrorsExitNonZero: a console or a command the node cannot give ends with its reason
// on stderr and a non-zero exit, whether standard input is empty or stays open (console printed
// nothing and exited 0: the end of standard input detached it, and the tunnel's error was
// dropped).
func TestTunnelErrorsExitNonZero(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{})
	url := env.Server(t)
	gw, _ := env.Gateway(t, "")
	ctx := context.Background()
	a := env.Compute.API
	if _, err := a.Pools.Create(ctx, env.RootKey, api.CreatePool{Name: "gpu"}); err != nil {
		t.Fatal(err)
	}
	tok, err := a.JoinTokens.Create(ctx, env.RootKey, api.CreateJoinToken{Pool: "gpu"})
	if err != nil {
		t.Fatal(err)
	}
	f, err := sim.Start(ctx, sim.Options{URL: url, Token: tok.Token, Gateway: gw, Nodes: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Stop()
	var res api.Reservation
	computetest.Eventually(t, 45*time.Second, "the simulated node's GPUs", func() bool {
		res, err = a.Reservations.Create(ctx, env.RootKey, api.CreateReservation{Pool: "gpu", Shape: api.Shape{GPUs: 8}}) // the whole node: its consoles are its whole holder's
		return err == nil
	})
	conn := connection(t, url, env.RootKey)

	open, done := io.Pipe() // standard input that stays open until the command ends
	defer done.Close()
	cases := []struct {
		name  string
		stdin io.Reader
		args  []string
		want  string
	}{
		{"console, empty stdin", strings.NewReader(""), []string{"console", "--reservation", res.ID}, `this node has no console ""`},
		{"console, open stdin", open, []string{"console", "--reservation", res.ID}, `this node has no console ""`},
		{"console by name", strings.NewReader(""), []string{"console", "--reservation", res.ID, "--console", "vm-0"}, `this node has no console "vm-0"`},
		{"exec", strings.NewReader(""), []string{"exec", "--reservation", res.ID, "--", "true"}, "this node runs no commands for tunnels"},
	}
	for _, c := range cases {
		var stdout, stderr bytes.Buffer
		code := runWith(c.stdin, append(conn, c.args...), &stdout, &stderr)
		if code != exitTunnelLost || !strings.Contains(stderr.String(), "the tunnel ended: "+c.want) || stdout.Len() != 0 {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want %d and %q", c.name, code, &stdout, &stderr, exitTunnelLost, c.want)
		}
	}
}
