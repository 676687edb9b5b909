package site

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// Bounds of the boot table: the boots kept (the least recently used go first), and the
// addresses one boot may speak from (its MAC's leases, and its machine's other MACs').
const (
	maxBoots     = 4096
	maxBootAddrs = 8
)

// bootsFile is where the boot table is kept, in StateDir.
const bootsFile = "boots.json"

// ramdiskBoot is one boot of a MAC into the ramdisk: what the site minted a token for when it
// served that MAC's ramdisk script. Its token authenticates the ramdisk's requests, from one of
// its addresses.
type ramdiskBoot struct {
	hash   [32]byte     // SHA-256 of the token; the token itself is kept nowhere
	mac    string       // the MAC the script was for
	addrs  []netip.Addr // where its requests may come from; the latest lease last
	issued time.Time
	used   time.Time // last request (in memory only): the eviction order
}

// bootTable is the site's current boots: one per MAC, the latest. It is kept in a file so that
// a site restarted while ramdisks run (a deploy streaming its image) still knows them, with the
// join credentials it has handed over (claims), which a boot gets once.
type bootTable struct {
	log *slog.Logger

	mu     sync.Mutex
	path   string // "" until load: nothing is written
	byMAC  map[string]*ramdiskBoot
	byHash map[[32]byte]*ramdiskBoot
	claims map[string][32]byte // task id → the boot its join credential went to
}

func newBootTable(log *slog.Logger) *bootTable {
	return &bootTable{log: log, byMAC: map[string]*ramdiskBoot{}, byHash: map[[32]byte]*ramdiskBoot{}, claims: map[string][32]byte{}}
}

// Why a request's token is refused.
var (
	errNoBoot      = errors.New("not the token of a current boot")
	errBootAddress = errors.New("the boot's token, from an address that is not its lease")
)

// mint starts a new boot of mac, from addr, ending the one before, and returns its token.
func (t *bootTable) mint(mac string, addr netip.Addr, now time.Time) string {
	var raw [32]byte
	_, _ = rand.Read(raw[:]) // crypto/rand does not fail
	token := base64.RawURLEncoding.EncodeToString(raw[:])
	b := &ramdiskBoot{hash: sha256.Sum256([]byte(token)), mac: mac, addrs: []netip.Addr{addr}, issued: now, used: now}
	t.mu.Lock()
	defer t.mu.Unlock()
	if old := t.byMAC[mac]; old != nil {
		delete(t.byHash, old.hash)
	}
	t.byMAC[mac], t.byHash[b.hash] = b, b
	for len(t.byMAC) > maxBoots {
		var oldest *ramdiskBoot
		for _, o := range t.byMAC {
			if oldest == nil || o.used.Before(oldest.used) {
				oldest = o
			}
		}
		t.log.Warn("boots: too many; the least recently used is forgotten", "mac", oldest.mac, "issued", oldest.issued)
		delete(t.byMAC, oldest.mac)
		delete(t.byHash, oldest.hash)
	}
	t.save()
	return token
}

// lookup is the boot whose token a request bears, if it comes from one of the boot's
// addresses: errNoBoot, or errBootAddress.
func (t *bootTable) lookup(token string, from netip.Addr, now time.Time) (ramdiskBoot, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.byHash[sha256.Sum256([]byte(token))]
	if b == nil {
		return ramdiskBoot{}, errNoBoot
	}
	if !slices.Contains(b.addrs, from.Unmap()) {
		return ramdiskBoot{}, fmt.Errorf("%w: %v (the site saw MAC %s at %v)", errBootAddress, from, b.mac, b.addrs)
	}
	b.used = now
	c := *b
	c.addrs = slices.Clone(b.addrs)
	return c, nil
}

// sawLease records that mac was given, or asked for, addr: the boots of mac's machine (macs:
// all of its MACs, or mac alone) may speak from addr from now on; any other boot that could,
// no longer can.
func (t *bootTable) sawLease(macs []string, addr netip.Addr) {
	t.mu.Lock()
	defer t.mu.Unlock()
	changed := false
	for mac, b := range t.byMAC {
		i := slices.Index(b.addrs, addr)
		switch {
		case slices.Contains(macs, mac):
			if i >= 0 && i == len(b.addrs)-1 {
				continue // the latest already
			}
			if i >= 0 {
				b.addrs = slices.Delete(b.addrs, i, i+1)
			}
			b.addrs = append(b.addrs, addr)
			if len(b.addrs) > maxBootAddrs {
				b.addrs = b.addrs[len(b.addrs)-maxBootAddrs:]
			}
			changed = true
		case i >= 0:
			b.addrs = slices.Delete(b.addrs, i, i+1)
			changed = true
		}
	}
	if changed {
		t.save()
	}
}

// claim gives task's join credential to the boot h: true the first time, and again to the
// same boot (its ramdisk asking again after an answer it did not get); false once another
// boot has had it.
func (t *bootTable) claim(task string, h [32]byte) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if got, ok := t.claims[task]; ok {
		return got == h
	}
	t.claims[task] = h
	t.save()
	return true
}

// keepClaims forgets the claims of tasks no longer in the plan.
func (t *bootTable) keepClaims(tasks map[string]bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	changed := false
	for task := range t.claims {
		if !tasks[task] {
			delete(t.claims, task)
			changed = true
		}
	}
	if changed {
		t.save()
	}
}

// bootRecord and bootState are the file's form of the table.
type bootRecord struct {
	TokenSHA256 string       `json:"tokenSha256"`
	MAC         string       `json:"mac"`
	Addrs       []netip.Addr `json:"addrs"`
	Issued      time.Time    `json:"issued"`
}

type bootState struct {
	Boots  []bootRecord      `json:"boots"`
	Claims map[string]string `json:"claims"` // task → tokenSha256
}

// load reads the table kept in dir (none there: empty), and keeps it there from now on. A file
// that cannot be read is logged and replaced: the ramdisks it knew must boot again.
func (t *bootTable) load(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("site: state directory: %w", err)
	}
	path := filepath.Join(dir, bootsFile)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.path = path
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	var st bootState
	if err == nil {
		err = json.Unmarshal(b, &st)
	}
	if err != nil {
		t.log.Error("boots: the kept boots cannot be read; ramdisks running now must PXE-boot again", "path", path, "err", err)
		return nil
	}
	for _, r := range st.Boots {
		h, ok := hash32(r.TokenSHA256)
		if !ok {
			continue
		}
		b := &ramdiskBoot{hash: h, mac: r.MAC, addrs: r.Addrs, issued: r.Issued, used: r.Issued}
		t.byMAC[b.mac], t.byHash[h] = b, b
	}
	for task, hx := range st.Claims {
		if h, ok := hash32(hx); ok {
			t.claims[task] = h
		}
	}
	t.log.Info("boots: kept boots read", "boots", len(t.byMAC), "claims", len(t.claims))
	return nil
}

func hash32(s string) ([32]byte, bool) {
	var h [32]byte
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != 32 {
		return h, false
	}
	copy(h[:], b)
	return h, true
}

// save writes the table (t.mu held): a temporary file, synced, renamed over the last one. A
// failure is logged: the site goes on, with boots a restart would forget.
func (t *bootTable) save() {
	if t.path == "" {
		return
	}
	st := bootState{Boots: make([]bootRecord, 0, len(t.byMAC)), Claims: map[string]string{}}
	for _, b := range t.byMAC {
		st.Boots = append(st.Boots, bootRecord{TokenSHA256: hex.EncodeToString(b.hash[:]), MAC: b.mac, Addrs: b.addrs, Issued: b.issued})
	}
	for task, h := range t.claims {
		st.Claims[task] = hex.EncodeToString(h[:])
	}
	if err := writeFileAtomic(t.path, st); err != nil {
		t.log.Error("boots: not kept (a restart of the site would forget them)", "path", t.path, "err", err)
	}
}

func writeFileAtomic(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // after the rename, nothing is there
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
