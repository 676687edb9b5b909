package sshkrl_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/better-compute/compute/internal/lib/sshkrl"
)

func newSigner(t testing.TB) ssh.Signer {
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newCert(t testing.TB, ca ssh.Signer, key ssh.PublicKey, serial uint64, keyID string) *ssh.Certificate {
	c := &ssh.Certificate{Key: key, Serial: serial, CertType: ssh.UserCert, KeyId: keyID, ValidPrincipals: []string{"p"},
		ValidBefore: uint64(time.Now().Add(time.Hour).Unix())}
	if err := c.SignCert(rand.Reader, ca); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestParseReadsWhatWriteWrote, a property over random lists: a certificate is revoked by the
// list read back exactly when Write was given its CA and serial.
func TestParseReadsWhatWriteWrote(t *testing.T) {
	t.Parallel()
	cas := []ssh.Signer{newSigner(t), newSigner(t), newSigner(t)}
	user := newSigner(t).PublicKey()
	for seed := range uint64(200) {
		rng := mrand.New(mrand.NewPCG(seed, 7))
		want := map[[2]uint64]bool{} // CA index, serial
		var revoked []sshkrl.Revoked
		for i, ca := range cas {
			if rng.IntN(3) == 0 {
				continue
			}
			r := sshkrl.Revoked{CA: ca.PublicKey()}
			for range rng.IntN(20) {
				s := 1 + rng.Uint64N(40)
				r.Serials = append(r.Serials, s)
				want[[2]uint64{uint64(i), s}] = true
			}
			revoked = append(revoked, r)
		}
		k, err := sshkrl.Parse(sshkrl.Write(seed, time.Unix(int64(seed), 0), revoked))
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if k.Version != seed {
			t.Fatalf("seed %d: version %d", seed, k.Version)
		}
		for i, ca := range cas {
			for s := uint64(1); s <= 42; s++ {
				if got := k.IsRevoked(newCert(t, ca, user, s, "k")); got != want[[2]uint64{uint64(i), s}] {
					t.Fatalf("seed %d: CA %d serial %d revoked %v, want %v", seed, i, s, got, !got)
				}
			}
		}
		if k.IsRevoked(user) {
			t.Fatalf("seed %d: a plain key revoked by a list of certificates", seed)
		}
	}
}

// TestParseAgreesWithOpenSSH: KRLs that OpenSSH's ssh-keygen writes, with every kind of
// section it writes (serials one by one, in ranges and bitmaps, key ids, plain keys by blob, by
// SHA-1 and by SHA-256), revoke what ssh-keygen -Q says they revoke.
func TestParseAgreesWithOpenSSH(t *testing.T) {
	t.Parallel()
	keygen, err := exec.LookPath("ssh-keygen")
	if err != nil {
		t.Skip("ssh-keygen is not installed (Debian package openssh-client)")
	}
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ca, other := newSigner(t), newSigner(t)
	caFile := write("ca.pub", ssh.MarshalAuthorizedKey(ca.PublicKey()))
	user, blocked, hashed, sha1d := newSigner(t).PublicKey(), newSigner(t).PublicKey(), newSigner(t).PublicKey(), newSigner(t).PublicKey()
	sum := sha256.Sum256(hashed.Marshal())
	spec := write("spec", []byte(strings.Join([]string{
		"serial: 3", "serial: 10-20", "serial: 5000-90000", "serial: 7000000", "serial: 100", "serial: 102", "serial: 104", "serial: 130", // a range, a bitmap for the sparse run, a list
		"id: leaked-laptop",
		"key: " + strings.TrimSpace(string(ssh.MarshalAuthorizedKey(blocked))),
		"hash: SHA256:" + strings.TrimRight(base64Std(sum[:]), "="),
		"sha1: " + strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sha1d))),
	}, "\n")+"\n"))
	krl := filepath.Join(dir, "krl")
	if out, err := exec.Command(keygen, "-k", "-f", krl, "-s", caFile, spec).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen -k: %v\n%s", err, out)
	}
	var keys []ssh.PublicKey
	for _, s := range []uint64{0, 1, 3, 4, 9, 10, 15, 20, 21, 100, 101, 102, 103, 104, 129, 130, 131, 4999, 5000, 60000, 90000, 90001, 7000000, 7000001} {
		keys = append(keys, newCert(t, ca, user, s, "k"), newCert(t, other, user, s, "k"))
	}
	keys = append(keys, newCert(t, ca, user, 50, "leaked-laptop"), newCert(t, other, user, 50, "leaked-laptop"),
		newCert(t, ca, blocked, 50, "k"), newCert(t, ca, hashed, 50, "k"), newCert(t, ca, sha1d, 50, "k"), blocked, hashed, sha1d, user)
	for _, list := range []string{krl} {
		b, err := os.ReadFile(list)
		if err != nil {
			t.Fatal(err)
		}
		k, err := sshkrl.Parse(b)
		if err != nil {
			t.Fatalf("%s: %v", filepath.Base(list), err)
		}
		for i, key := range keys {
			f := write(fmt.Sprintf("key-%d.pub", i), ssh.MarshalAuthorizedKey(key))
			out, _ := exec.Command(keygen, "-Q", "-f", list, f).CombinedOutput()
			want := strings.Contains(string(out), "REVOKED")
			if got := k.IsRevoked(key); got != want {
				desc := key.Type()
				if c, ok := key.(*ssh.Certificate); ok {
					desc = fmt.Sprintf("certificate serial %d id %q of CA %s", c.Serial, c.KeyId, ssh.FingerprintSHA256(c.SignatureKey))
				}
				t.Errorf("%s: %s revoked %v; ssh-keygen -Q says %q", filepath.Base(list), desc, got, out)
			}
		}
	}
}

// FuzzParse: whatever the bytes, Parse returns a list or an error, and a list answers.
func FuzzParse(f *testing.F) {
	ca := newSigner(f)
	f.Add(sshkrl.Write(1, time.Unix(0, 0), nil))
	f.Add(sshkrl.Write(9, time.Unix(5, 0), []sshkrl.Revoked{{CA: ca.PublicKey(), Serials: []uint64{1, 5, 9}}}))
	cert := newCert(f, ca, newSigner(f).PublicKey(), 5, "k")
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := sshkrl.Parse(b)
		if err != nil {
			return
		}
		k.IsRevoked(cert)
		k.IsRevoked(cert.Key)
	})
}

func base64Std(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
