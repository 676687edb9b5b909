package vps_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/better-compute/compute"
	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/internal/lib/sshkrl"
	"github.com/better-compute/compute/vps"
	"github.com/better-compute/compute/vps/hostapi"
)

// TestSandboxKRLFollowsRevocations (simulated host, real database): a sandbox's part of its
// host's state carries the KRL of its reservation, which revokes a certificate once
// access.revoke does and not the others; once the sandbox went (its reservation released)
// every certificate of the reservation not yet expired is in its KRL.
func TestSandboxKRLFollowsRevocations(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	key := f.RootKey
	if _, err := compute.Invoke(f.ctx, f.Compute, key, vps.SandboxTemplatesCreate, vps.CreateSandboxTemplate{Name: "t", Pool: "mixed",
		Flavor: "cpu16", Image: "guest"}); err != nil {
		t.Fatal(err)
	}
	sb, err := compute.Invoke(f.ctx, f.Compute, key, vps.SandboxesCreate, vps.CreateSandbox{Template: "t", Name: "s"})
	if err != nil {
		t.Fatal(err)
	}
	certFor := func() *ssh.Certificate {
		t.Helper()
		pub, _, _ := ed25519.GenerateKey(rand.Reader)
		k, _ := ssh.NewPublicKey(pub)
		issued, err := f.Compute.API.Access.SSHCertificate(f.ctx, key, api.SignSSHKey{Reservation: sb.ReservationID,
			PublicKey: string(ssh.MarshalAuthorizedKey(k)), TTL: "10m"})
		if err != nil {
			t.Fatal(err)
		}
		c, _, _, _, err := ssh.ParseAuthorizedKey([]byte(issued.Certificate))
		if err != nil {
			t.Fatal(err)
		}
		return c.(*ssh.Certificate)
	}
	revoked, kept := certFor(), certFor()
	krlOf := func(in hostapi.Instance) *sshkrl.KRL {
		t.Helper()
		k, err := sshkrl.Parse(in.SSHRevoked)
		if err != nil {
			t.Fatalf("the sandbox's KRL: %v", err)
		}
		return k
	}
	d := f.desired(t, func(d hostapi.Instances) bool { return len(d.Instances) == 1 })
	if in := d.Instances[0]; !in.Agent || krlOf(in).IsRevoked(revoked) || krlOf(in).IsRevoked(kept) {
		t.Fatalf("before a revocation: agent %v, a KRL that revokes %v / %v", in.Agent, krlOf(in).IsRevoked(revoked), krlOf(in).IsRevoked(kept))
	}
	if _, err := f.Compute.API.Access.Revoke(f.ctx, key, api.RevokeSSHCertificate{Serial: int64(revoked.Serial)}); err != nil {
		t.Fatal(err)
	}
	d = f.desired(t, func(d hostapi.Instances) bool {
		return len(d.Instances) == 1 && krlOf(d.Instances[0]).IsRevoked(revoked)
	})
	if krlOf(d.Instances[0]).IsRevoked(kept) {
		t.Fatal("a revocation revoked another certificate of the reservation")
	}

	f.sandbox(t, vps.SandboxesDelete, "s")
	f.desired(t, func(d hostapi.Instances) bool { return len(d.Instances) == 0 })
	// Its guest is told no more: the KRL is the one the module would hand it, from its runtime.
	b, err := f.rt.Access.SSHRevoked(f.ctx, f.rt.DB.Pool, sb.ReservationID)
	if err != nil {
		t.Fatal(err)
	}
	k, err := sshkrl.Parse(b)
	if err != nil || !k.IsRevoked(kept) || !k.IsRevoked(revoked) {
		t.Fatalf("the KRL of a reservation that ended: %v; revokes kept %v", err, err == nil && k.IsRevoked(kept))
	}
}
