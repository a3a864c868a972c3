package logstore

import "testing"

// A change nobody waits for costs no allocation (on a busy replica most
// changes find no waiter), and a waiter's channel is still closed by the
// next change, the one after it by a later one.
func TestAChangeNobodyWaitsForAllocatesNothing(t *testing.T) {
	r := newRange(nil, "r", nil)
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := testing.AllocsPerRun(100, r.notifyLocked); n != 0 {
		t.Errorf("notifyLocked with nobody waiting: %v allocations, want 0", n)
	}
	ch := r.changedLocked()
	if again := r.changedLocked(); again != ch {
		t.Fatal("two waiters before a change got different channels")
	}
	r.notifyLocked()
	select {
	case <-ch:
	default:
		t.Fatal("the change did not close the waiter's channel")
	}
	next := r.changedLocked()
	if next == ch {
		t.Fatal("the next waiter got the closed channel")
	}
	select {
	case <-next:
		t.Fatal("the next waiter's channel is closed before any change")
	default:
	}
}
