// Package iamtest has test doubles around real IAM ports: Counting counts and records what
// Better Compute asks, so tests can assert "exactly one decision per mutation, none on fleet paths".
package iamtest

import (
	"context"
	"sync"

	"github.com/better-compute/compute/iam"
)

// Counting wraps a Port and records every question asked of it.
type Counting struct {
	iam.Port

	mu        sync.Mutex
	decisions []iam.Request
	auths     int
}

// NewCounting wraps p.
func NewCounting(p iam.Port) *Counting { return &Counting{Port: p} }

// Initialize passes through to the wrapped port when it has state to prepare.
func (c *Counting) Initialize(ctx context.Context) error {
	if i, ok := c.Port.(iam.Initializer); ok {
		return i.Initialize(ctx)
	}
	return nil
}

// SetResolver passes through to the wrapped port when it resolves resources.
func (c *Counting) SetResolver(r iam.Resolver) {
	if s, ok := c.Port.(iam.ResolverSetter); ok {
		s.SetResolver(r)
	}
}

// Invalidate passes through to the wrapped port when it has caches.
func (c *Counting) Invalidate(e iam.Event) {
	if i, ok := c.Port.(iam.Invalidator); ok {
		i.Invalidate(e)
	}
}

// Authenticate implements iam.Port.
func (c *Counting) Authenticate(ctx context.Context, cred string) (iam.Principal, error) {
	c.mu.Lock()
	c.auths++
	c.mu.Unlock()
	return c.Port.Authenticate(ctx, cred)
}

// Authorize implements iam.Port.
func (c *Counting) Authorize(ctx context.Context, p iam.Principal, r iam.Request) (iam.Decision, error) {
	c.mu.Lock()
	c.decisions = append(c.decisions, r)
	c.mu.Unlock()
	return c.Port.Authorize(ctx, p, r)
}

// AuthorizeMany implements iam.Port; each request counts as a decision.
func (c *Counting) AuthorizeMany(ctx context.Context, p iam.Principal, rs []iam.Request) ([]iam.Decision, error) {
	c.mu.Lock()
	c.decisions = append(c.decisions, rs...)
	c.mu.Unlock()
	return c.Port.AuthorizeMany(ctx, p, rs)
}

// Decisions returns the requests decided since the last Reset.
func (c *Counting) Decisions() []iam.Request {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]iam.Request(nil), c.decisions...)
}

// Authentications returns how many credentials were authenticated since the last Reset.
func (c *Counting) Authentications() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.auths
}

// Reset forgets what was recorded.
func (c *Counting) Reset() {
	c.mu.Lock()
	c.decisions, c.auths = nil, 0
	c.mu.Unlock()
}
