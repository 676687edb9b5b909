package fleet_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
)

func certPEM(t *testing.T, ca bool) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "a TPM maker"},
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), BasicConstraintsValid: true, IsCA: ca}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// TestPoolAttestationPolicy: a pool's attestation policy defaults to off, is set at create and
// replaced whole by update (other updates leave it), and a bad one is refused naming the field.
func TestPoolAttestationPolicy(t *testing.T) {
	t.Parallel()
	env := computetest.New(t, computetest.Options{})
	ctx, pools := context.Background(), env.Compute.API.Pools
	plain, err := pools.Create(ctx, env.RootKey, api.CreatePool{Name: "plain"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(api.PoolAttestation{TPM: api.TPMOff, EKRoots: []string{}}, plain.Attestation); diff != "" {
		t.Errorf("the default policy (-want +got):\n%s", diff)
	}
	root := certPEM(t, true)
	want := api.PoolAttestation{TPM: api.TPMRequired, EKRoots: []string{root}}
	p, err := pools.Create(ctx, env.RootKey, api.CreatePool{Name: "attested", Attestation: &want})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, p.Attestation); diff != "" {
		t.Errorf("created (-want +got):\n%s", diff)
	}
	desc := "GPUs"
	if p, err = pools.Update(ctx, env.RootKey, api.UpdatePool{Pool: "attested", Description: &desc}); err != nil || !cmp.Equal(want, p.Attestation) {
		t.Errorf("an update of the description changed the policy: %+v, %v", p.Attestation, err)
	}
	optional := api.PoolAttestation{TPM: api.TPMOptional}
	if p, err = pools.Update(ctx, env.RootKey, api.UpdatePool{Pool: "attested", Attestation: &optional}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(api.PoolAttestation{TPM: api.TPMOptional, EKRoots: []string{}}, p.Attestation); diff != "" {
		t.Errorf("updated (-want +got):\n%s", diff)
	}
	if got, err := pools.Get(ctx, env.RootKey, api.GetPool{Pool: "attested"}); err != nil || got.Attestation.TPM != api.TPMOptional {
		t.Errorf("read back: %+v, %v", got.Attestation, err)
	}

	for _, c := range []struct {
		name  string
		att   api.PoolAttestation
		field string
	}{
		{"an unknown mode", api.PoolAttestation{TPM: "always"}, "attestation.tpm"},
		{"not PEM", api.PoolAttestation{TPM: api.TPMRequired, EKRoots: []string{"MIIB..."}}, "attestation.ekRoots[0]"},
		{"not a CA", api.PoolAttestation{TPM: api.TPMRequired, EKRoots: []string{root, certPEM(t, false)}}, "attestation.ekRoots[1]"},
		{"two in one", api.PoolAttestation{TPM: api.TPMRequired, EKRoots: []string{root + root}}, "attestation.ekRoots[0]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := pools.Create(ctx, env.RootKey, api.CreatePool{Name: "bad", Attestation: &c.att})
			if ae, ok := err.(*api.Error); !ok || ae.Code != api.CodeInvalidArgument || !strings.HasPrefix(ae.Message, c.field) {
				t.Fatalf("create: %v, want invalid_argument naming %s", err, c.field)
			}
			_, err = pools.Update(ctx, env.RootKey, api.UpdatePool{Pool: "plain", Attestation: &c.att})
			if ae, ok := err.(*api.Error); !ok || ae.Code != api.CodeInvalidArgument || !strings.HasPrefix(ae.Message, c.field) {
				t.Fatalf("update: %v, want invalid_argument naming %s", err, c.field)
			}
		})
	}
}
