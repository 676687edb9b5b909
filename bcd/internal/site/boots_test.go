package site

import (
	"errors"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/compute/metal/siteapi"
)

// TestBootTable: a boot's token works from its addresses only; a lease of its machine's MACs
// adds one, a lease of the address to another machine takes it away; the MAC's next boot ends
// it; the least recently used boots go past the bound.
func TestBootTable(t *testing.T) {
	t.Parallel()
	bt := newBootTable(slog.New(slog.DiscardHandler))
	now := time.Unix(1700000000, 0)
	x, y, z := netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("192.0.2.11"), netip.MustParseAddr("192.0.2.12")
	tok := bt.mint(macRamdisk, x, now)
	check := func(token string, from netip.Addr, want error) {
		t.Helper()
		if _, err := bt.lookup(token, from, now); !errors.Is(err, want) {
			t.Errorf("lookup from %v: %v, want %v", from, err, want)
		}
	}
	check(tok, x, nil)
	check(tok, y, errBootAddress)
	check("nope", x, errNoBoot)
	bt.sawLease([]string{macSecond, macRamdisk}, y) // the ramdisk took its lease on the other NIC
	check(tok, y, nil)
	bt.sawLease([]string{macIdle}, x) // x is another machine's now
	check(tok, x, errBootAddress)
	check(tok, y, nil)
	for i := range maxBootAddrs + 2 { // a bounded list: the latest stay
		bt.sawLease([]string{macRamdisk}, netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}))
	}
	check(tok, y, errBootAddress)
	check(tok, netip.AddrFrom4([4]byte{10, 0, 0, maxBootAddrs + 1}), nil)

	again := bt.mint(macRamdisk, z, now)
	check(tok, netip.AddrFrom4([4]byte{10, 0, 0, maxBootAddrs + 1}), errNoBoot)
	check(again, z, nil)

	for i := range maxBoots + 1 {
		now = now.Add(time.Second)
		mac := netip.AddrFrom4([4]byte{byte(i >> 8), byte(i), 0, 0}).String() // any distinct key
		bt.mint(mac, z, now)
	}
	if len(bt.byMAC) != maxBoots || len(bt.byHash) != maxBoots {
		t.Errorf("%d boots by MAC, %d by token: want %d", len(bt.byMAC), len(bt.byHash), maxBoots)
	}
	check(again, z, errNoBoot) // the least recently used
}

// TestBootsOutliveARestart: a site restarted on its state directory still knows its ramdisks'
// boots (a deploy streaming its image goes on) and who had a join credential; a state file that
// cannot be read is replaced, and its boots are forgotten.
func TestBootsOutliveARestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := fixture(t, dir, newRecorder())
	p := testPlan(siteapi.UnknownInspect)
	p.Machines[0].Task = &siteapi.Task{ID: "deploy-1", Kind: siteapi.TaskWipe, Then: siteapi.ThenKexec, Kernel: "http://images.test/k", JoinCredential: "bcdeploy_secret"}
	ask := func(ts *testSite, token string) int {
		status, _, _ := ts.do(t, "POST", siteapi.PathCredential, token, toJSON(t, siteapi.CredentialRequest{Machine: "m-ramdisk", Task: "deploy-1"}))
		return status
	}
	first := startSite(t, cfg)
	must(t, first.SetPlan(p))
	token, other := first.bootToken(t, macRamdisk), first.bootToken(t, macSecond)
	if status, _, _ := first.do(t, "HEAD", "/boot/ipxe?mac="+macRamdisk, "", ""); status != http.StatusOK {
		t.Errorf("HEAD of the script: %d", status) // no boot: token stays the MAC's
	}
	if status := ask(first, token); status != http.StatusOK {
		t.Fatalf("the credential: %d", status)
	}
	must(t, first.stop())
	b, err := os.ReadFile(filepath.Join(cfg.StateDir, bootsFile))
	must(t, err)
	for _, secret := range []string{token, other, "bcdeploy_secret"} {
		if strings.Contains(string(b), secret) {
			t.Errorf("the state file holds %q: %s", secret, b)
		}
	}
	if fi, err := os.Stat(cfg.StateDir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the state directory: %v, %v; want 0700", fi.Mode(), err)
	}

	cfg.Upstream = newRecorder()
	second := startSite(t, cfg)
	must(t, second.SetPlan(p))
	if status, body, _ := second.do(t, "GET", siteapi.PathTask+"?machine=m-ramdisk", token, ""); status != http.StatusOK {
		t.Errorf("a boot of before the restart asks for its task: %d %s", status, body)
	}
	if ask(second, token) != http.StatusOK || ask(second, other) != http.StatusGone {
		t.Error("after the restart the credential goes to another boot, or not to the one that had it")
	}
	must(t, second.stop())

	must(t, os.WriteFile(filepath.Join(cfg.StateDir, bootsFile), []byte("{not json"), 0o600))
	third := startSite(t, cfg)
	must(t, third.SetPlan(p))
	if status, _, _ := third.do(t, "GET", siteapi.PathTask+"?machine=m-ramdisk", token, ""); status != http.StatusUnauthorized {
		t.Errorf("a boot of a state file that could not be read: %d, want 401", status)
	}
}
