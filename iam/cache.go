package iam

import (
	"sync"
	"time"
)

// DecisionCache remembers allowed and denied decisions for a short time, for reads only:
// mutations always decide afresh. It is bounded: when full, it drops expired entries and then,
// if still full, everything.
type DecisionCache struct {
	ttl time.Duration
	max int
	now func() time.Time

	mu      sync.Mutex
	entries map[cacheKey]cacheEntry
}

type cacheKey struct {
	identity, key, tenant, action string
	resource                      Resource
}

func keyOf(p Principal, r Request) (cacheKey, bool) {
	// A request with context (an address, a time) is decided each time.
	return cacheKey{p.ID, p.KeyID, r.TenantID, r.Action, r.Resource}, len(r.Context) == 0
}

type cacheEntry struct {
	d       Decision
	expires time.Time
}

// NewDecisionCache returns a cache that keeps a decision for ttl, at most max of them.
func NewDecisionCache(ttl time.Duration, max int) *DecisionCache {
	return &DecisionCache{ttl: ttl, max: max, now: time.Now, entries: map[cacheKey]cacheEntry{}}
}

// Get returns a cached decision for p and r.
func (c *DecisionCache) Get(p Principal, r Request) (Decision, bool) {
	if c == nil || c.ttl <= 0 {
		return Decision{}, false
	}
	k, cacheable := keyOf(p, r)
	if !cacheable {
		return Decision{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[k]
	if !ok || !c.now().Before(e.expires) {
		return Decision{}, false
	}
	return e.d, true
}

// Put stores a decision.
func (c *DecisionCache) Put(p Principal, r Request, d Decision) {
	if c == nil || c.ttl <= 0 {
		return
	}
	k, cacheable := keyOf(p, r)
	if !cacheable {
		return
	}
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= c.max {
		for k, e := range c.entries {
			if !now.Before(e.expires) {
				delete(c.entries, k)
			}
		}
		if len(c.entries) >= c.max {
			clear(c.entries)
		}
	}
	c.entries[k] = cacheEntry{d, now.Add(c.ttl)}
}

// Forget drops every decision made for an identity (all its keys), e.g. when a key is revoked.
func (c *DecisionCache) Forget(identityID string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.entries {
		if k.identity == identityID {
			delete(c.entries, k)
		}
	}
}

// Clear drops every decision, e.g. when a tenant is deleted.
func (c *DecisionCache) Clear() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.entries)
}

// Invalidate drops what an IAM event makes stale: the decisions of an identity whose key or
// token was revoked or that gained a role, or everything when a tenant goes. Other events change nothing cached.
func (c *DecisionCache) Invalidate(e Event) {
	switch e.Type {
	case EventKeyRevoked, EventTokenRevoked, EventBindingCreated:
		c.Forget(e.Subject)
	case EventTenantDeleted:
		c.Clear()
	}
}

// Len is the number of entries held.
func (c *DecisionCache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}
