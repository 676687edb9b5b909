package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/better-compute/compute/api"
	"github.com/better-compute/compute/computetest"
)

// sshAs logs in to the sshd at addr as user with the certificate cert of key, and runs cmd.
func sshAs(addr, login string, key ed25519.PrivateKey, cert string, cmd string) (string, error) {
	signer, err := ssh.NewSignerFromKey(key)
	if err != nil {
		return "", err
	}
	pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(cert))
	if err != nil {
		return "", err
	}
	certSigner, err := ssh.NewCertSigner(pub.(*ssh.Certificate), signer)
	if err != nil {
		return "", err
	}
	c, err := ssh.Dial("tcp", addr, &ssh.ClientConfig{User: login, Auth: []ssh.AuthMethod{ssh.PublicKeys(certSigner)},
		HostKeyCallback: ssh.InsecureIgnoreHostKey(), Timeout: 10 * time.Second})
	if err != nil {
		return "", err
	}
	defer c.Close()
	sess, err := c.NewSession()
	if err != nil {
		return "", err
	}
	defer sess.Close()
	out, err := sess.CombinedOutput(cmd)
	return string(out), err
}

// TestSSHCertificatesOpenANodesSSHD: a real bcd node keeps a real OpenSSH sshd's access files
// (the sshd_config it writes is what sshd includes); a certificate the API signs for a
// reservation holding the node lets its holder in, and is refused once revoked, once the
// reservation ends, and once it expires. A break-glass certificate is an event with its reason.
func TestSSHCertificatesOpenANodesSSHD(t *testing.T) {
	t.Parallel()
	sshdBin := "/usr/sbin/sshd"
	if _, err := os.Stat(sshdBin); err != nil {
		t.Skip("OpenSSH's sshd is not installed (Debian package openssh-server; .ci/run installs it)")
	}
	if os.Geteuid() != 0 {
		t.Skip("sshd runs as root to log users in")
	}
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	e := newE2E(t, e2eOptions{})
	ctx := context.Background()
	a, key := e.API, e.RootKey
	dir := t.TempDir()
	// sshd reads a holder's principals file as the holder's user: the directory, and the
	// holders' homes, are where it may walk (t.TempDir is root's alone).
	base, err := os.MkdirTemp("", "bcd-ssh-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	sshdDir := filepath.Join(base, "sshd")
	e.node(nodeOptions{Name: "ssh-node", Args: []string{"--sshd-dir", sshdDir, "--ssh-user", me.Username, "--home", filepath.Join(base, "home"), "--proc-hidepid=false"}})
	computetest.Eventually(t, e2eWait, "bcd's sshd_config", func() bool {
		_, err := os.Stat(filepath.Join(sshdDir, "sshd_config"))
		return err == nil
	})

	// sshd on a loopback port, including the configuration bcd wrote.
	addr := e.sshd(sshdBin, dir, sshdDir, 0)

	// The reservation below needs the node's GPUs in: bcd writes its sshd_config before its
	// first inventory is applied.
	e.online("ssh-node")

	// A reservation holding the node, and a certificate for its holder.
	res, err := a.Reservations.Create(ctx, key, api.CreateReservation{Pool: e2ePool, Shape: api.Shape{GPUs: 1}})
	if err != nil {
		t.Fatal(err)
	}
	_, userKey, _ := ed25519.GenerateKey(rand.Reader)
	pub, _ := ssh.NewPublicKey(userKey.Public())
	pubLine := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub))) + " alice@laptop"
	cert := func(ttl string, breakGlass bool) api.SSHCertificate {
		t.Helper()
		c, err := a.Access.SSHCertificate(ctx, key, api.SignSSHKey{Reservation: res.ID, PublicKey: pubLine, TTL: ttl, BreakGlass: breakGlass, Reason: map[bool]string{true: "pager: disk full"}[breakGlass]})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	first := cert("10m", false)
	if len(first.Principals) != 1 || first.Principals[0] != api.ReservationPrincipal(res.ID) || first.User != api.ReservationUser(res.ID) {
		t.Fatalf("certificate = %+v", first)
	}
	// A holder of one GPU of eight logs in as its reservation's own user, not as --ssh-user.
	login := first.User
	t.Cleanup(func() { _ = exec.Command("userdel", login).Run() })
	principals := filepath.Join(sshdDir, "principals", login)
	computetest.Eventually(t, e2eWait, "the reservation's principal on the node", func() bool {
		b, _ := os.ReadFile(principals)
		return strings.Contains(string(b), api.ReservationPrincipal(res.ID))
	})
	// The tenant's CA was made by the first certificate, and reaches the node after it: the
	// principal above came earlier, with the reservation.
	parsed, _, _, _, err := ssh.ParseAuthorizedKey([]byte(first.Certificate))
	if err != nil {
		t.Fatal(err)
	}
	ca := strings.Fields(string(ssh.MarshalAuthorizedKey(parsed.(*ssh.Certificate).SignatureKey)))[1]
	computetest.Eventually(t, e2eWait, "the tenant's CA on the node", func() bool {
		b, _ := os.ReadFile(filepath.Join(sshdDir, "trusted_user_ca_keys"))
		return strings.Contains(string(b), ca)
	})
	if out, err := sshAs(addr, login, userKey, first.Certificate, "echo in as $(id -un)"); err != nil || !strings.Contains(out, "in as "+login) {
		t.Fatalf("ssh with the reservation's certificate: %q, %v", out, err)
	}
	if out, err := sshAs(addr, me.Username, userKey, first.Certificate, "id -un"); err == nil {
		t.Fatalf("a holder of part of the node logged in as the operator login %s: %q", me.Username, out)
	}
	// A certificate of the shortest lifetime (10 s) lets its holder in; it is tried again once
	// it has expired, below, after the checks that take their time meanwhile.
	short := cert("10s", false)
	if _, err := sshAs(addr, login, userKey, short.Certificate, "true"); err != nil {
		t.Fatalf("a fresh short certificate: %v", err)
	}

	// A revoked certificate is refused; another one of the same reservation still works.
	second := cert("10m", false)
	if _, err := a.Access.Revoke(ctx, key, api.RevokeSSHCertificate{Serial: second.Serial}); err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, e2eWait, "the revoked certificate refused", func() bool {
		_, err := sshAs(addr, login, userKey, second.Certificate, "true")
		return err != nil
	})
	if _, err := sshAs(addr, login, userKey, first.Certificate, "true"); err != nil {
		t.Fatalf("the first certificate after the second's revocation: %v", err)
	}
	// ssh-keygen agrees: the KRL bcd wrote revokes the second's serial, not the first's.
	for _, check := range []struct {
		c    api.SSHCertificate
		want string
	}{{second, "REVOKED"}, {first, "ok"}} {
		c, want := check.c, check.want
		f := filepath.Join(dir, fmt.Sprintf("cert-%d.pub", c.Serial))
		if err := os.WriteFile(f, []byte(c.Certificate+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		out, _ := exec.Command("ssh-keygen", "-Q", "-f", filepath.Join(sshdDir, "revoked_keys.krl"), f).CombinedOutput()
		if !strings.Contains(string(out), want) {
			t.Errorf("ssh-keygen -Q of certificate %d: %q, want %s", c.Serial, out, want)
		}
	}

	// Break-glass, by an operator of the node (the root tenant owns its pool): the operator
	// login, and the reason is an event.
	bg := cert("10m", true)
	var reason string
	if err := e.DB.Pool.QueryRow(ctx, `SELECT data->>'reason' FROM compute.events WHERE type = 'access.break_glass' AND subject = $1`, res.ID).Scan(&reason); err != nil || reason != "pager: disk full" {
		t.Fatalf("the break-glass event's reason = %q, %v", reason, err)
	}
	computetest.Eventually(t, e2eWait, "the break-glass certificate's operator login", func() bool {
		out, err := sshAs(addr, me.Username, userKey, bg.Certificate, "id -un")
		return err == nil && strings.TrimSpace(out) == me.Username
	})

	// The short certificate, expired, is refused. sshd reads the real clock: the test waits for
	// the certificate's end, which is what it tests, then for sshd to see it (its clock counts
	// in seconds).
	time.Sleep(time.Until(short.ValidBefore))
	computetest.Eventually(t, 5*time.Second, "the expired certificate refused", func() bool {
		_, err := sshAs(addr, login, userKey, short.Certificate, "true")
		return err != nil
	})

	// The reservation ends: its user and principals leave the node (bcd writes the revocation
	// list before the principals files, and the holder's file goes with its user), and every
	// certificate of it is refused. The logins are tried once that is done, not while: a holder
	// logging in again and again keeps bcd from removing its user, which holds back the rest.
	if _, err := a.Reservations.Release(ctx, key, api.ReleaseReservation{Reservation: res.ID}); err != nil {
		t.Fatal(err)
	}
	computetest.Eventually(t, e2eWait, "no principals once the reservation ended", func() bool {
		b, _ := os.ReadFile(filepath.Join(sshdDir, "principals", me.Username))
		_, err := os.Stat(principals)
		return len(b) == 0 && errors.Is(err, os.ErrNotExist)
	})
	if _, err := sshAs(addr, me.Username, userKey, bg.Certificate, "true"); err == nil {
		t.Error("the break-glass certificate let its holder in after the reservation ended")
	}
	if _, err := sshAs(addr, login, userKey, first.Certificate, "true"); err == nil {
		t.Error("the reservation's certificate let its holder in after the reservation ended")
	}
}

// sshd starts sshd on a loopback port in the mount namespace of process pid (bcd's), with
// bcd's configuration included, and returns its address.
func (e *e2e) sshd(sshdBin, dir, sshdDir string, pid int) string {
	t := e.t
	t.Helper()
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	_, port, _ := net.SplitHostPort(addr)
	hostKey := filepath.Join(dir, "host_ed25519")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", hostKey).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v\n%s", err, out)
	}
	cfg := filepath.Join(dir, "sshd_config")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`Port %s
ListenAddress 127.0.0.1
HostKey %s
PidFile %s
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
AuthorizedKeysFile none
StrictModes no
Include %s
`, port, hostKey, filepath.Join(dir, "sshd.pid"), filepath.Join(sshdDir, "sshd_config"))), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil { // its privilege-separation directory
		t.Fatal(err)
	}
	args := []string{sshdBin, "-D", "-e", "-f", cfg}
	if pid > 0 {
		args = append([]string{"nsenter", "--mount=/proc/" + strconv.Itoa(pid) + "/ns/mnt", "--"}, args...)
	}
	e.start("sshd", exec.Command(args[0], args[1:]...))
	// sshd says so once it listens (-e: its log on stderr).
	e.waitLog("sshd listening", "Server listening on 127.0.0.1 port "+port)
	return addr
}
