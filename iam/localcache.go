package iam

import (
	"sync"
	"time"
)

// DefaultEmbeddedCacheTTL is how long the embedded IAM reuses an authenticated key and an
// identity's policies before reading them again.
const DefaultEmbeddedCacheTTL = 2 * time.Second

// ttlCache is a small bounded map whose entries expire. When full it drops what has expired,
// then everything.
type ttlCache[K comparable, V any] struct {
	ttl time.Duration
	max int

	mu      sync.Mutex
	entries map[K]ttlEntry[V]
	gen     uint64 // bumped by clear, so that a read begun before it is not stored after it
}

type ttlEntry[V any] struct {
	v       V
	expires time.Time
}

func newTTLCache[K comparable, V any](ttl time.Duration, max int) *ttlCache[K, V] {
	return &ttlCache[K, V]{ttl: ttl, max: max, entries: map[K]ttlEntry[V]{}}
}

func (c *ttlCache[K, V]) get(k K) (V, uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[k]
	if !ok || time.Now().After(e.expires) {
		var zero V
		return zero, c.gen, false
	}
	return e.v, c.gen, true
}

// put stores v unless the cache was cleared since gen was read.
func (c *ttlCache[K, V]) put(k K, v V, gen uint64, expires time.Time) {
	if c.ttl <= 0 {
		return
	}
	if e := time.Now().Add(c.ttl); expires.IsZero() || e.Before(expires) {
		expires = e
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen {
		return
	}
	if len(c.entries) >= c.max {
		now := time.Now()
		for k, e := range c.entries {
			if now.After(e.expires) {
				delete(c.entries, k)
			}
		}
		if len(c.entries) >= c.max {
			clear(c.entries)
		}
	}
	c.entries[k] = ttlEntry[V]{v, expires}
}

// set stores v whatever was cleared before: for values that outlive a clear harmlessly, within
// the TTL.
func (c *ttlCache[K, V]) set(k K, v V) {
	c.mu.Lock()
	gen := c.gen
	c.mu.Unlock()
	c.put(k, v, gen, time.Time{})
}

// deleteFunc drops the entries whose key del reports, and keeps what is being read from being
// stored after it, as clear does.
func (c *ttlCache[K, V]) deleteFunc(del func(K) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.entries {
		if del(k) {
			delete(c.entries, k)
		}
	}
	c.gen++
}

func (c *ttlCache[K, V]) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

func (c *ttlCache[K, V]) clear() {
	c.mu.Lock()
	clear(c.entries)
	c.gen++
	c.mu.Unlock()
}
