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
	if n := testing.AllocsPerRun(100, r.grown.notify); n != 0 {
		t.Errorf("an index commit's notify with nobody waiting: %v allocations, want 0", n)
	}
	var b broadcast
	ch := b.wait()
	if again := b.wait(); again != ch {
		t.Fatal("two waiters before a change got different channels")
	}
	b.notify()
	select {
	case <-ch:
	default:
		t.Fatal("the change did not close the waiter's channel")
	}
	next := b.wait()
	if next == ch {
		t.Fatal("the next waiter got the closed channel")
	}
	select {
	case <-next:
		t.Fatal("the next waiter's channel is closed before any change")
	default:
	}
}
