package site

import (
	"net/netip"
	"sync"
	"time"
)

// How long an offered address is held for the client it was offered to, and how long an
// address a client declined (found in use) is not offered again.
const (
	offerHold   = 30 * time.Second
	declineHold = 10 * time.Minute
)

// leaseTable is full DHCP's record of the addresses given out. It lives in memory only: after
// a restart, a client renewing its address gets it back if no other client took it meanwhile,
// and a client asking for a new one may be offered one that is still in use by a machine the
// site forgot (it then declines it and is offered another).
type leaseTable struct {
	mu         sync.Mutex
	start, end uint32
	ttl        time.Duration
	byMAC      map[string]*lease
	byAddr     map[uint32]*lease
	declined   map[uint32]time.Time // address → not offered before
}

type lease struct {
	mac     string
	addr    uint32
	bound   bool // requested and acknowledged; false: only offered
	expires time.Time
}

func newLeaseTable(start, end netip.Addr, ttl time.Duration) *leaseTable {
	return &leaseTable{
		start: u32(start), end: u32(end), ttl: ttl,
		byMAC: map[string]*lease{}, byAddr: map[uint32]*lease{}, declined: map[uint32]time.Time{},
	}
}

func u32(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

func addrOf(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// offer picks an address for mac: the one it already has, else the one it asks for (want, may be
// zero) if that is free, else the first free one; ok is false when the range is exhausted.
func (t *leaseTable) offer(mac string, want netip.Addr, now time.Time) (netip.Addr, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if l := t.byMAC[mac]; l != nil && !t.isDeclined(l.addr, now) {
		if !l.bound || l.expires.Before(now) {
			l.bound = false
			l.expires = now.Add(offerHold)
		}
		return addrOf(l.addr), true
	}
	pick, found := uint32(0), false
	if want.Is4() && t.free(u32(want), mac, now) {
		pick, found = u32(want), true
	}
	for a := t.start; !found && a <= t.end && a >= t.start; a++ {
		if t.byAddr[a] == nil && !t.isDeclined(a, now) {
			pick, found = a, true
		}
	}
	for a := t.start; !found && a <= t.end && a >= t.start; a++ {
		if t.free(a, mac, now) {
			pick, found = a, true
		}
	}
	if !found {
		return netip.Addr{}, false
	}
	t.set(mac, pick, false, now.Add(offerHold))
	return addrOf(pick), true
}

// request binds addr to mac for the lease time, as a DHCPREQUEST asks (selecting the site's
// offer, rebooting or renewing); false is a NAK: the address is not the site's to give or
// another machine holds it.
func (t *leaseTable) request(mac string, addr netip.Addr, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !addr.Is4() || !t.free(u32(addr), mac, now) {
		return false
	}
	t.set(mac, u32(addr), true, now.Add(t.ttl))
	return true
}

// release ends mac's lease of addr.
func (t *leaseTable) release(mac string, addr netip.Addr) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if l := t.byMAC[mac]; l != nil && (!addr.IsValid() || l.addr == u32(addr)) {
		t.drop(l)
	}
}

// decline records that addr, offered to mac, is in use by something else.
func (t *leaseTable) decline(mac string, addr netip.Addr, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if l := t.byMAC[mac]; l != nil && (!addr.IsValid() || l.addr == u32(addr)) {
		t.declined[l.addr] = now.Add(declineHold)
		t.drop(l)
	}
}

// forget drops what was only offered to mac: it chose another server.
func (t *leaseTable) forget(mac string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if l := t.byMAC[mac]; l != nil && !l.bound {
		t.drop(l)
	}
}

// free reports whether a may be given to mac: in the range, not declined, and not held by
// another machine.
func (t *leaseTable) free(a uint32, mac string, now time.Time) bool {
	if a < t.start || a > t.end || t.isDeclined(a, now) {
		return false
	}
	l := t.byAddr[a]
	return l == nil || l.mac == mac || l.expires.Before(now)
}

func (t *leaseTable) isDeclined(a uint32, now time.Time) bool {
	until, ok := t.declined[a]
	if ok && !now.Before(until) {
		delete(t.declined, a)
		return false
	}
	return ok
}

func (t *leaseTable) set(mac string, a uint32, bound bool, expires time.Time) {
	if old := t.byAddr[a]; old != nil {
		t.drop(old)
	}
	if old := t.byMAC[mac]; old != nil {
		t.drop(old)
	}
	l := &lease{mac: mac, addr: a, bound: bound, expires: expires}
	t.byMAC[mac], t.byAddr[a] = l, l
}

func (t *leaseTable) drop(l *lease) {
	delete(t.byMAC, l.mac)
	delete(t.byAddr, l.addr)
}

// heardTable is what proxy DHCP knows of the machines' addresses, which another server gives:
// the address each MAC last asked for (its DHCPREQUEST, broadcast on the provisioning network
// or relayed to the site, or its request to the proxy on port 4011 from that address). The
// boots of a MAC are bound to it.
type heardTable struct {
	mu    sync.Mutex
	byMAC map[string]heardAddr
}

type heardAddr struct {
	addr netip.Addr
	at   time.Time
}

// maxHeard bounds the MACs heard: the oldest are forgotten first.
const maxHeard = 1 << 16

func newHeardTable() *heardTable { return &heardTable{byMAC: map[string]heardAddr{}} }

func (h *heardTable) heard(mac string, addr netip.Addr, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.byMAC[mac] = heardAddr{addr, now}
	if len(h.byMAC) > maxHeard {
		oldest := mac
		for m, a := range h.byMAC {
			if a.at.Before(h.byMAC[oldest].at) {
				oldest = m
			}
		}
		delete(h.byMAC, oldest)
	}
}

func (h *heardTable) addr(mac string) (netip.Addr, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	a, ok := h.byMAC[mac]
	return a.addr, ok
}

// bound is the address mac holds now (requested and acknowledged, not expired).
func (t *leaseTable) bound(mac string, now time.Time) (netip.Addr, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	l := t.byMAC[mac]
	if l == nil || !l.bound || l.expires.Before(now) {
		return netip.Addr{}, false
	}
	return addrOf(l.addr), true
}
