package compute_test

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/lib/tufrepo"
)

// releaseSigner holds the offline keys of a test's release repository, for the method tables'
// steps: the bodies of releases.setRoot, releases.upload and releases.publish.
type releaseSigner struct {
	root, targets ed25519.PrivateKey
	build         []byte
}

func newReleaseSigner(t *testing.T) *releaseSigner {
	t.Helper()
	_, root, _ := ed25519.GenerateKey(nil)
	_, targets, _ := ed25519.GenerateKey(nil)
	return &releaseSigner{root: root, targets: targets, build: []byte("#!/bin/sh\necho bcd v1.0.0\n")}
}

func (s *releaseSigner) rootBody(t *testing.T) string {
	t.Helper()
	snap, ts, err := tufrepo.OnlineKeys(computetest.Secret)
	if err != nil {
		t.Fatal(err)
	}
	b, err := tufrepo.SignRoot(1, tufrepo.RootKeys{Root: []ed25519.PublicKey{s.root.Public().(ed25519.PublicKey)},
		Targets: []ed25519.PublicKey{s.targets.Public().(ed25519.PublicKey)}, Snapshot: snap.Public().(ed25519.PublicKey),
		Timestamp: ts.Public().(ed25519.PublicKey)}, time.Now().Add(time.Hour), s.root)
	if err != nil {
		t.Fatal(err)
	}
	return `{"root": ` + string(b) + `}`
}

func (s *releaseSigner) uploadBody() string {
	sum := sha256.Sum256(s.build)
	return fmt.Sprintf(`{"version": "v1.0.0", "os": "linux", "arch": "amd64", "length": %d, "sha256": "%s"}`, len(s.build), hex.EncodeToString(sum[:]))
}

// publishBody uploads the build with the ticket at ticketURL (no IAM decision: the ticket is
// the credential) and returns targets listing it, signed by the targets key.
func (s *releaseSigner) publishBody(t *testing.T, base, ticketURL string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPut, base+ticketURL, bytes.NewReader(s.build))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("upload: %s", res.Status)
	}
	b, err := tufrepo.SignTargets(nil, []tufrepo.BuildFile{{Build: tufrepo.Build{Version: "v1.0.0", OS: "linux", Arch: "amd64"}, Bytes: bytes.NewReader(s.build)}},
		s.targets, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return `{"targets": ` + string(b) + `}`
}
