// Package swtpmtest starts software TPMs for tests: Debian's swtpm, manufactured by swtpm_setup
// with EK certificates signed by a CA the test makes, serving raw TPM 2.0 commands over TCP on
// loopback (what tpmattest.Open and bcd join --tpm host:port dial). A test skips, saying what to
// install, where swtpm is missing.
package swtpmtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"

	"github.com/better-compute/compute/internal/lib/tpmattest"
)

// Packages is what to install for these tests, said when they skip.
const Packages = "apt-get install swtpm swtpm-tools"

// CA is a certificate authority made for a test, as a TPM manufacturer's would be.
type CA struct {
	Cert *x509.Certificate
	PEM  string // the certificate, as a pool's ekRoots takes it
	key  *ecdsa.PrivateKey
}

// NewCA makes a self-signed CA named name.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name, Organization: []string{"Better Compute tests"}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{Cert: cert, PEM: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})), key: key}
}

// TPM is a running swtpm.
type TPM struct {
	Addr string // host:port of its command channel
	CA   *CA    // the CA that signed its EK certificates
}

// Require skips the test where swtpm and its tools are missing.
func Require(t testing.TB) {
	t.Helper()
	for _, bin := range []string{"swtpm", "swtpm_setup", "swtpm_localca", "swtpm_cert"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not found: the TPM attestation tests need a software TPM (%s)", bin, Packages)
		}
	}
}

// Start manufactures a TPM 2.0 (an RSA 2048 and an ECC EK, each with a certificate from a new
// CA, and the SHA-256 PCR bank) and starts it until the test ends.
func Start(t testing.TB) *TPM {
	t.Helper()
	Require(t)
	dir := t.TempDir()
	ca := NewCA(t, "swtpmtest TPM manufacturer CA")
	keyDER, err := x509.MarshalPKCS8PrivateKey(ca.key)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"ca/signkey.pem":    string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})),
		"ca/issuercert.pem": ca.PEM,
		"setup.conf": fmt.Sprintf("create_certs_tool = swtpm_localca\ncreate_certs_tool_config = %s\ncreate_certs_tool_options = %s\nactive_pcr_banks = sha256\n",
			filepath.Join(dir, "localca.conf"), filepath.Join(dir, "localca.options")),
		"localca.conf": fmt.Sprintf("statedir = %[1]s\nsigningkey = %[1]s/signkey.pem\nissuercert = %[1]s/issuercert.pem\ncertserial = %[1]s/certserial\n",
			filepath.Join(dir, "ca")),
		"localca.options": "",
	}
	for _, d := range []string{"ca", "state"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"--tpm2", "--tpmstate", filepath.Join(dir, "state"), "--create-ek-cert", "--config", filepath.Join(dir, "setup.conf"),
		"--pcr-banks", "sha256", "--overwrite"}
	if os.Geteuid() == 0 {
		args = append(args, "--runas", "root") // else it drops to the tss user, who cannot write here
	}
	if out, err := exec.Command("swtpm_setup", args...).CombinedOutput(); err != nil {
		t.Fatalf("swtpm_setup %v: %v\n%s", args, err, out)
	}
	var last error
	for range 3 { // a port picked free may be taken before swtpm binds it
		addr, err := serve(t, dir)
		if err == nil {
			return &TPM{Addr: addr, CA: ca}
		}
		last = err
	}
	t.Fatalf("swtpm: %v", last)
	return nil
}

// serve starts swtpm on two free loopback ports and waits until it accepts connections.
func serve(t testing.TB, dir string) (string, error) {
	ports := make([]int, 2)
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		ports[i] = ln.Addr().(*net.TCPAddr).Port
		ln.Close()
	}
	log, err := os.Create(filepath.Join(dir, "swtpm.log"))
	if err != nil {
		return "", err
	}
	defer log.Close()
	cmd := exec.Command("swtpm", "socket", "--tpm2",
		"--server", "type=tcp,bindaddr=127.0.0.1,port="+strconv.Itoa(ports[0]),
		"--ctrl", "type=tcp,bindaddr=127.0.0.1,port="+strconv.Itoa(ports[1]),
		"--tpmstate", "dir="+filepath.Join(dir, "state"), "--flags", "not-need-init,startup-clear")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return "", err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		select {
		case err := <-exited:
			b, _ := os.ReadFile(filepath.Join(dir, "swtpm.log"))
			return "", fmt.Errorf("swtpm exited: %v\n%s", err, b)
		default:
		}
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			t.Cleanup(func() {
				cmd.Process.Kill()
				<-exited
			})
			return addr, nil
		}
	}
	cmd.Process.Kill()
	<-exited
	return "", fmt.Errorf("swtpm did not listen on %s within 10s", addr)
}

// Open connects to the TPM (one connection at a time: swtpm serves one client).
func (s *TPM) Open() (io.ReadWriteCloser, error) { return tpmattest.Open(s.Addr) }

// with runs f on a connection to the TPM.
func (s *TPM) with(t testing.TB, f func(transport.TPM)) {
	t.Helper()
	rw, err := s.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	f(transport.FromReadWriter(rw))
}

// Extend extends PCR pcr of the SHA-256 bank with the SHA-256 digest digest, as firmware
// measuring a boot stage does.
func (s *TPM) Extend(t testing.TB, pcr int, digest []byte) {
	t.Helper()
	s.with(t, func(tpm transport.TPM) {
		_, err := tpm2.PCRExtend{
			PCRHandle: tpm2.AuthHandle{Handle: tpm2.TPMHandle(pcr), Auth: tpm2.PasswordAuth(nil)},
			Digests:   tpm2.TPMLDigestValues{Digests: []tpm2.TPMTHA{{HashAlg: tpm2.TPMAlgSHA256, Digest: digest}}},
		}.Execute(tpm)
		if err != nil {
			t.Fatalf("extend PCR %d: %v", pcr, err)
		}
	})
}

// PCRs reads the TPM's SHA-256 values of PCRs 0-7.
func (s *TPM) PCRs(t testing.TB) [][]byte {
	t.Helper()
	var pcrs [][]byte
	s.with(t, func(tpm transport.TPM) {
		var err error
		if pcrs, err = tpmattest.ReadPCRs(tpm); err != nil {
			t.Fatal(err)
		}
	})
	return pcrs
}
