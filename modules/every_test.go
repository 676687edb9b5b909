package modules_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/compute/modules"
)

// TestEveryResetsItsBackoffAfterASuccess: a function that failed many times (the backoff grew)
// and then succeeded is retried quickly when it fails again, not after the grown backoff; and a
// failure does not end Every.
func TestEveryResetsItsBackoffAfterASuccess(t *testing.T) {
	const tick = 50 * time.Millisecond // long enough that a loaded machine's timer delays do not blur the backoff
	var calls []time.Time
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Fails 6 times (backoffs up to 32 ticks), succeeds once, then fails twice more.
	outcomes := []bool{false, false, false, false, false, false, true, false, false}
	done := make(chan error, 1)
	go func() {
		done <- modules.Every(ctx, tick, func() error {
			calls = append(calls, time.Now())
			if len(calls) == len(outcomes)+1 {
				cancel()
				return nil
			}
			if outcomes[len(calls)-1] {
				return nil
			}
			return errors.New("the database is restarting")
		})
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Every = %v, want nil once its context ended", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Every stopped calling after failures")
	}
	if len(calls) != len(outcomes)+1 {
		t.Fatalf("%d calls, want %d", len(calls), len(outcomes)+1)
	}
	grown := calls[6].Sub(calls[5])      // after the sixth failure: 16 to 32 ticks
	afterReset := calls[9].Sub(calls[8]) // after the second failure past a success: at most two ticks
	if grown < 16*tick {
		t.Fatalf("the backoff did not grow: %v after six failures", grown)
	}
	if afterReset >= grown/2 {
		t.Fatalf("after a success the retry waited %v, as long as before it (%v): the backoff was not reset", afterReset, grown)
	}
}

// TestEveryOrWokenRunsWhenWoken: with an hour between rounds, a round runs as soon as its wake
// channel closes, including one closed while the round before was running.
func TestEveryOrWokenRunsWhenWoken(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wake := make(chan struct{})
	var mu sync.Mutex
	current := wake
	next := func() <-chan struct{} { mu.Lock(); defer mu.Unlock(); return current }
	fire := func() { mu.Lock(); close(current); current = make(chan struct{}); mu.Unlock() }
	rounds := make(chan int, 10)
	n := 0
	go func() {
		_ = modules.EveryOrWoken(ctx, time.Hour, next, func() error {
			n++
			if n == 2 {
				fire() // woken during a round: the next one runs at once too
			}
			rounds <- n
			return nil
		})
	}()
	<-rounds // the first round, at once
	fire()
	for want := 2; want <= 3; want++ {
		select {
		case got := <-rounds:
			if got != want {
				t.Fatalf("round %d, want %d", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d did not run within 5s of its wake (the period is an hour)", want)
		}
	}
	select {
	case got := <-rounds:
		t.Fatalf("round %d ran without a wake", got)
	case <-time.After(100 * time.Millisecond):
	}
}
