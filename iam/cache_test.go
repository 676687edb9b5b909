package iam_test

import (
	"testing"
	"time"

	"github.com/better-compute/compute/iam"
)

func TestDecisionCache(t *testing.T) {
	t.Parallel()
	c := iam.NewDecisionCache(time.Hour, 3)
	ada, bob := iam.Principal{ID: "idn_ada", KeyID: "key_1"}, iam.Principal{ID: "idn_bob", KeyID: "key_2"}
	list := iam.Request{TenantID: "root", Action: "compute:pools:list", Resource: iam.Resource{Type: "compute-pool", ID: "*"}}
	get := iam.Request{TenantID: "root", Action: "compute:pools:get", Resource: iam.Resource{Type: "compute-pool", ID: "p1"}}
	c.Put(ada, list, iam.Decision{Allowed: true})
	c.Put(ada, get, iam.Decision{Allowed: false})
	c.Put(bob, list, iam.Decision{Allowed: true})
	if d, ok := c.Get(ada, list); !ok || !d.Allowed {
		t.Fatalf("ada's list = %+v, %v", d, ok)
	}
	if d, ok := c.Get(ada, get); !ok || d.Allowed {
		t.Fatalf("ada's get = %+v, %v", d, ok)
	}
	if _, ok := c.Get(iam.Principal{ID: "idn_ada", KeyID: "key_3"}, list); ok {
		t.Fatal("a decision for one key answered for another")
	}
	withContext := list
	withContext.Context = map[string]any{"request.ip": "10.0.0.1"}
	c.Put(ada, withContext, iam.Decision{Allowed: true})
	if _, ok := c.Get(ada, withContext); ok {
		t.Fatal("a request with context was cached")
	}

	c.Invalidate(iam.Event{Type: iam.EventKeyRevoked, Subject: ada.ID})
	if _, ok := c.Get(ada, list); ok || c.Len() != 1 {
		t.Fatalf("after ada's key was revoked: %d entries", c.Len())
	}
	if _, ok := c.Get(bob, list); !ok {
		t.Fatal("revoking ada's key dropped bob's decision")
	}
	c.Invalidate(iam.Event{Type: iam.EventFlagSet, Subject: "compute.spot"})
	if c.Len() != 1 {
		t.Fatal("a flag change dropped decisions")
	}
	c.Invalidate(iam.Event{Type: iam.EventTenantDeleted, Subject: "org"})
	if c.Len() != 0 {
		t.Fatal("a deleted tenant left decisions")
	}

	// Bounded: a fourth entry into a full cache of live ones starts it afresh.
	for i, id := range []string{"a", "b", "c", "d"} {
		c.Put(iam.Principal{ID: id}, list, iam.Decision{Allowed: true})
		if want := i%3 + 1; c.Len() != want {
			t.Fatalf("after %d puts: %d entries, want %d", i+1, c.Len(), want)
		}
	}

	var off *iam.DecisionCache
	off.Put(ada, list, iam.Decision{Allowed: true})
	if _, ok := off.Get(ada, list); ok || off.Len() != 0 {
		t.Fatal("a nil cache cached")
	}
}

// TestDecisionCacheDecideRace: a decision made while an event invalidated the cache (from
// policies the event made stale) is answered but not kept.
func TestDecisionCacheDecideRace(t *testing.T) {
	t.Parallel()
	c := iam.NewDecisionCache(time.Hour, 10)
	ada := iam.Principal{ID: "idn_ada", KeyID: "key_1"}
	list := iam.Request{TenantID: "root", Action: "compute:pools:list", Resource: iam.Resource{Type: "compute-pool", ID: "*"}}
	d, err := c.Decide(ada, list, func() (iam.Decision, error) {
		c.Invalidate(iam.Event{Type: iam.EventBindingCreated, Subject: ada.ID})
		return iam.Decision{Allowed: false}, nil
	})
	if err != nil || d.Allowed {
		t.Fatalf("Decide = %+v, %v", d, err)
	}
	if _, ok := c.Get(ada, list); ok {
		t.Fatal("a denial decided across a binding event was cached")
	}
	calls := 0
	for range 2 {
		if _, err := c.Decide(ada, list, func() (iam.Decision, error) { calls++; return iam.Decision{Allowed: true}, nil }); err != nil {
			t.Fatal(err)
		}
	}
	if calls != 1 {
		t.Fatalf("decided %d times, want once and then from the cache", calls)
	}
	withInput := list
	withInput.Input = []byte(`{}`)
	c.Put(ada, withInput, iam.Decision{Allowed: true})
	if _, ok := c.Get(ada, withInput); ok {
		t.Fatal("a request naming its input (an agent's) was cached")
	}
}
