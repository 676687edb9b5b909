package main

import (
	"bytes"
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/better-compute/compute/api"

	"github.com/better-compute/compute/computetest"
)

// TestMethodFlagsNeverShadowTheConnection: webhooks create --url is the webhook's URL while the
// control plane comes from $BETTER_COMPUTE_URL (it was "no control plane": the method's --url
// shadowed the global one and counted as it being set), --event-types takes a list, and --server
// names the control plane whatever flags a method has.
func TestMethodFlagsNeverShadowTheConnection(t *testing.T) {
	env := computetest.New(t, computetest.Options{})
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	t.Setenv("HOME", t.TempDir())
	server := env.Server(t)
	t.Setenv("BETTER_COMPUTE_URL", server)
	t.Setenv("BETTER_COMPUTE_API_KEY", env.RootKey)

	var stdout, stderr bytes.Buffer
	code := run([]string{"webhooks", "create", "--url", "https://hooks.example.com/compute", "--event-types", "node.,reservation.preempted", "-o", "json"}, &stdout, &stderr)
	if code != 0 || !strings.Contains(stdout.String(), `"url": "https://hooks.example.com/compute"`) ||
		!strings.Contains(stdout.String(), `"reservation.preempted"`) {
		t.Fatalf("webhooks create with $BETTER_COMPUTE_URL = %d\n%s%s", code, &stdout, &stderr)
	}
	// --server wins over the environment, with a method's --url beside it.
	t.Setenv("BETTER_COMPUTE_URL", "http://127.0.0.1:1")
	stdout.Reset()
	stderr.Reset()
	code = run([]string{"webhooks", "create", "--server", server, "--url", "https://hooks.example.com/other", "--event-types", "node."}, &stdout, &stderr)
	if code != 0 || !strings.Contains(stdout.String(), "https://hooks.example.com/other") {
		t.Fatalf("webhooks create --server = %d\n%s%s", code, &stdout, &stderr)
	}
	// The old --url still names the control plane where no method field takes the name.
	stdout.Reset()
	stderr.Reset()
	code = run([]string{"pools", "list", "--url", server}, &stdout, &stderr)
	if code != 0 || stderr.Len() != 0 {
		t.Fatalf("pools list --url = %d\n%s%s", code, &stdout, &stderr)
	}
	var n int
	if err := env.DB.Pool.QueryRow(context.Background(), `SELECT count(*) FROM compute.webhook_endpoints`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d webhooks (%v), want 2", n, err)
	}
}

// reservedInput is an input whose fields bear the names of the CLI's own flags.
type reservedInput struct {
	Server         string `json:"server"`
	APIKey         string `json:"apiKey"`
	Output         string `json:"output"`
	Config         string `json:"config"`
	JSON           string `json:"json"`
	IdempotencyKey string `json:"idempotencyKey"`
	Help           bool   `json:"help"`
	URL            string `json:"url"`
	Pool           string `json:"pool"`
}

// TestReservedFlagNames: a method field named as one of the CLI's own flags gets the flag
// --input-NAME, so it neither shadows the CLI's flag nor is dropped; other fields keep their names.
func TestReservedFlagNames(t *testing.T) {
	t.Parallel()
	// Every flag of the root but the hidden --url is reserved.
	newRoot(&profile{}).PersistentFlags().VisitAll(func(f *pflag.Flag) {
		if f.Name != legacyServerFlag && !slices.Contains(reservedFlags, f.Name) {
			t.Errorf("the root's --%s is not in reservedFlags", f.Name)
		}
	})
	m := api.NewMethod[reservedInput, api.Pool]("tests", "create", true, "compute-pool", "v0", "A test method.")
	cmd, mc := newMethodCommand(&profile{}, m)
	want := map[string]string{"server": "input-server", "apiKey": "input-api-key", "output": "input-output", "config": "input-config",
		"json": "input-json", "idempotencyKey": "input-idempotency-key", "help": "input-help", "url": "url", "pool": "pool"}
	for field, flag := range want {
		if cmd.Flags().Lookup(flag) == nil {
			t.Errorf("field %s: no flag --%s", field, flag)
		}
	}
	if err := cmd.ParseFlags([]string{"--input-server", "s", "--input-output", "o", "--url", "u", "--input-json", "j", "--pool", "p"}); err != nil {
		t.Fatal(err)
	}
	v, err := mc.input(cmd, cmd.Flags().Args())
	if err != nil {
		t.Fatal(err)
	}
	got := v.Interface().(reservedInput)
	if !reflect.DeepEqual(got, reservedInput{Server: "s", Output: "o", URL: "u", JSON: "j", Pool: "p"}) {
		t.Fatalf("input = %+v", got)
	}
}
