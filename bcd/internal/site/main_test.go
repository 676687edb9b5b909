package site

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		// The test binary re-executed inside a network namespace: a site server for the
		// DHCP tests (netns_test.go).
		os.Exit(runChild(spec))
	}
	goleak.VerifyTestMain(m)
}
