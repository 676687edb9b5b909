package selfupdate

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
	"github.com/better-compute/compute/internal/lib/tufrepo"
	"github.com/better-compute/compute/internal/node/nodeagent"
)

// gatewayWithRepo serves a repository of one build (good, or other bytes in its place when
// tampered) over TLS that requires a client certificate of its own CA, as a gateway does, and
// returns the identity of a node of that CA.
func gatewayWithRepo(t *testing.T, version string, good []byte, tampered bool) nodeagent.Identity {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	caDER, _ := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	ca, _ := x509.ParseCertificate(caDER)
	issue := func(serial int64, server bool) ([]byte, *ecdsa.PrivateKey) {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "n"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
		if server {
			tmpl.ExtKeyUsage, tmpl.IPAddresses = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, []net.IP{net.ParseIP("127.0.0.1")}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return der, k
	}
	srvDER, srvKey := issue(2, true)
	nodeDER, nodeKey := issue(3, false)

	// The repository: all four keys here (the test plays signer and control plane).
	keys := make([]ed25519.PrivateKey, 4)
	for i := range keys {
		_, keys[i], _ = ed25519.GenerateKey(nil)
	}
	pubOf := func(k ed25519.PrivateKey) ed25519.PublicKey { return k.Public().(ed25519.PublicKey) }
	exp := time.Now().Add(time.Hour)
	root, err := tufrepo.SignRoot(1, tufrepo.RootKeys{Root: []ed25519.PublicKey{pubOf(keys[0])}, Targets: []ed25519.PublicKey{pubOf(keys[1])},
		Snapshot: pubOf(keys[2]), Timestamp: pubOf(keys[3])}, exp, keys[0])
	if err != nil {
		t.Fatal(err)
	}
	b := tufrepo.Build{Version: version, OS: runtime.GOOS, Arch: runtime.GOARCH}
	targets, err := tufrepo.SignTargets(nil, []tufrepo.BuildFile{{Build: b, Bytes: bytes.NewReader(good)}}, keys[1], exp)
	if err != nil {
		t.Fatal(err)
	}
	snap, _ := tufrepo.NewSnapshot(1, 1, exp, keys[2])
	ts, _ := tufrepo.NewTimestamp(1, snap, 1, exp, keys[3])
	served := good
	if tampered {
		served = bytes.ToUpper(good)
	}
	files := map[string][]byte{
		tufrepo.MetadataPath + "1.root.json": root, tufrepo.MetadataPath + "1.targets.json": targets,
		tufrepo.MetadataPath + "1.snapshot.json": snap, tufrepo.MetadataPath + "timestamp.json": ts,
		tufrepo.TargetsPath + sha256hex(good) + "." + tufrepo.TargetName(b.Version, b.OS, b.Arch): served,
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.TLS.PeerCertificates) == 0 {
			http.Error(w, "no certificate", http.StatusUnauthorized)
			return
		}
		body, ok := files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		_, _ = w.Write(body)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{srvDER}, PrivateKey: srvKey}},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool, MinVersion: tls.VersionTLS13}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	keyDER, _ := x509.MarshalPKCS8PrivateKey(nodeKey)
	return nodeagent.Identity{NodeID: "n", KeyDER: keyDER, CertDER: nodeDER, CADER: [][]byte{caDER}, Gateways: []string{srv.Listener.Addr().String()}}
}

func sha256hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestUpdaterInstallsOnlyVerifiedBuilds runs the updater as bcd node does, against a gateway
// that asks for the node's certificate: a verified build lands in the other slot, on trial, and
// the node is restarted into it; a tampered one is refused, and the slots are left alone.
func TestUpdaterInstallsOnlyVerifiedBuilds(t *testing.T) {
	t.Parallel()
	for _, tampered := range []bool{false, true} {
		t.Run("tampered="+strconv.FormatBool(tampered), func(t *testing.T) {
			t.Parallel()
			good := []byte("#!/bin/sh\necho bcd v2\n")
			id := gatewayWithRepo(t, "v2", good, tampered)
			dir := t.TempDir()
			self := dir + "/bcd-v1"
			writeFile(t, self, "#!/bin/sh\necho bcd v1\n")
			s := Slots{Dir: dir + "/slots"}
			var mu sync.Mutex
			var restarted string
			u, err := New(Config{Slots: s, Version: "v1", Self: self, MetadataDir: dir + "/releases", Deadline: time.Minute,
				Identity: func() (nodeagent.Identity, bool, error) { return id, true, nil },
				Restart:  func(path string) { mu.Lock(); restarted = path; mu.Unlock() },
				Logger:   slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan struct{})
			go func() { defer close(done); _ = u.Run(ctx) }()
			payload, _ := json.Marshal(api.BCDRelease{Version: "v2", Rollout: "r", Attempt: 1})
			if err := u.Extension().Desired[api.BCDReleaseKind](ctx, api.BCDReleaseVersion, payload); err != nil {
				t.Fatal(err)
			}
			if !tampered {
				computetest.Eventually(t, 30*time.Second, "the restart into the new slot", func() bool { mu.Lock(); defer mu.Unlock(); return restarted != "" })
				<-done
				if restarted != s.Path(SlotB) {
					t.Fatalf("restarted into %s", restarted)
				}
				if b, _ := os.ReadFile(s.Path(SlotB)); !bytes.Equal(b, good) {
					t.Fatalf("slot b holds %q", b)
				}
				tr, _ := s.Trial()
				if cur, _, _ := s.Current(); cur != SlotB || tr == nil || tr.Previous != SlotA || tr.Version != "v2" || tr.Try != "v2/r#1" {
					t.Fatalf("current %s, trial %+v", cur, tr)
				}
				if b, _ := os.ReadFile(s.Path(SlotA)); !strings.Contains(string(b), "bcd v1") {
					t.Fatalf("slot a (the previous binary) holds %q", b)
				}
				return
			}
			computetest.Eventually(t, 30*time.Second, "the refusal", func() bool { return strings.Contains(u.Status().Error, "does not verify") })
			mu.Lock()
			defer mu.Unlock()
			if restarted != "" {
				t.Fatalf("a tampered build was restarted into: %s", restarted)
			}
			if _, err := os.Stat(s.Path(SlotB)); !os.IsNotExist(err) {
				t.Fatalf("a tampered build was written to slot b: %v", err)
			}
			if cur, _, _ := s.Current(); cur != SlotA {
				t.Fatalf("current is %s", cur)
			}
		})
	}
}
