package iam

import "time"

// DecisionCache remembers allowed and denied decisions for a short time, for reads only:
// mutations always decide afresh. It is bounded like the embedded port's caches (ttlCache): when
// full, it drops expired entries and then, if still full, everything. A nil cache caches nothing.
type DecisionCache struct {
	c *ttlCache[cacheKey, Decision]
}

type cacheKey struct {
	identity, key, tenant, action string
	resource                      Resource
}

func keyOf(p Principal, r Request) (cacheKey, bool) {
	// A request with context (an address, a time) is decided each time, and so is one that names
	// its input (an agent's: a confirmation may be spent on it).
	return cacheKey{p.ID, p.KeyID, r.TenantID, r.Action, r.Resource}, len(r.Context) == 0 && r.Input == nil
}

// NewDecisionCache returns a cache that keeps a decision for ttl, at most max of them.
func NewDecisionCache(ttl time.Duration, max int) *DecisionCache {
	return &DecisionCache{newTTLCache[cacheKey, Decision](ttl, max)}
}

// Get returns a cached decision for p and r.
func (c *DecisionCache) Get(p Principal, r Request) (Decision, bool) {
	k, cacheable := keyOf(p, r)
	if c == nil || !cacheable {
		return Decision{}, false
	}
	d, _, ok := c.c.get(k)
	return d, ok
}

// Put stores a decision. One made just before a Forget may be stored just after it; it lives at
// most the TTL, and the revoked credential no longer authenticates anyway.
func (c *DecisionCache) Put(p Principal, r Request, d Decision) {
	k, cacheable := keyOf(p, r)
	if c != nil && cacheable {
		c.c.set(k, d)
	}
}

// Decide returns the cached decision for p and r, or the one decide makes, cached unless the
// cache was invalidated while decide ran: a decision read from policies an event has since made
// stale (a new binding) must not outlive that event. A nil cache only calls decide.
func (c *DecisionCache) Decide(p Principal, r Request, decide func() (Decision, error)) (Decision, error) {
	k, cacheable := keyOf(p, r)
	if c == nil || !cacheable {
		return decide()
	}
	d, gen, ok := c.c.get(k)
	if ok {
		return d, nil
	}
	d, err := decide()
	if err == nil {
		c.c.put(k, d, gen, time.Time{})
	}
	return d, err
}

// Forget drops every decision made for an identity (all its keys), e.g. when a key is revoked.
func (c *DecisionCache) Forget(identityID string) {
	if c != nil {
		c.c.deleteFunc(func(k cacheKey) bool { return k.identity == identityID })
	}
}

// Clear drops every decision, e.g. when a tenant is deleted.
func (c *DecisionCache) Clear() {
	if c != nil {
		c.c.clear()
	}
}

// Invalidate drops what an IAM event makes stale: the decisions of an identity whose key or
// token was revoked or that gained a role, or everything when a tenant goes. Other events change
// nothing cached.
func (c *DecisionCache) Invalidate(e Event) {
	switch e.Type {
	case EventKeyRevoked, EventTokenRevoked, EventBindingCreated:
		c.Forget(e.Subject)
	case EventTenantDeleted:
		c.Clear()
	}
}

// Len is the number of entries held, expired or not.
func (c *DecisionCache) Len() int {
	if c == nil {
		return 0
	}
	return c.c.len()
}
