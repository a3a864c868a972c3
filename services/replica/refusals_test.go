package replica

import (
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect"
)

// One fetch loop at a time probes an address that refuses connections;
// the others wait for the probe, the wait doubles up to its cap, and an
// answer from the address releases every loop at once.
func TestRefusalsPaceDialsToADeadLeader(t *testing.T) {
	var r refusals
	const addr = "http://127.0.0.1:1"
	now := time.Unix(1000, 0)
	refused := connect.NewError(connect.CodeUnavailable, errors.New("dial tcp 127.0.0.1:1: connect: connection refused"))

	if d := r.hold(addr, now); d != 0 {
		t.Fatalf("an address never refused is held %v", d)
	}
	r.observe(addr, refused, now)
	if d := r.hold(addr, now); d != refusedWaitMin {
		t.Fatalf("after one refusal a loop waits %v, want %v", d, refusedWaitMin)
	}
	// When the wait is over exactly one caller gets to dial.
	now = now.Add(refusedWaitMin)
	if d := r.hold(addr, now); d != 0 {
		t.Fatalf("the first loop after the wait is held %v, want to probe", d)
	}
	for i := range 100 {
		if d := r.hold(addr, now); d == 0 {
			t.Fatalf("loop %d dials while another probes", i)
		}
	}
	// Repeated refusals double the wait up to the cap.
	for range 10 {
		r.observe(addr, refused, now)
	}
	if d := r.hold(addr, now); d != refusedWaitMax {
		t.Fatalf("after many refusals a loop waits %v, want the cap %v", d, refusedWaitMax)
	}
	// Any answer that reached the server clears the address.
	r.observe(addr, connect.NewError(connect.CodeFailedPrecondition, errors.New("not the leader")), now)
	if d := r.hold(addr, now); d != 0 {
		t.Fatalf("an address that answered is still held %v", d)
	}
	// Other errors (a timeout) do not count as refusals.
	r.observe(addr, connect.NewError(connect.CodeDeadlineExceeded, errors.New("deadline")), now)
	if d := r.hold(addr, now); d != 0 {
		t.Fatalf("a timeout made the address held %v", d)
	}
}

// The fetch loop's failure log: the first failure after a quiet spell at
// once, then at most one line per interval carrying the count it skipped;
// a success closes a long run of failures with one line, a short one
// (a flaky link) with none.
func TestFailureLog(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	l := failureLog{every: time.Second}
	type step struct {
		ms      int
		fail    bool
		log     bool
		skipped int           // for a failure
		run     time.Duration // for a success
	}
	for i, s := range []step{
		{ms: 0, fail: true, log: true},                        // the first: at once
		{ms: 100, fail: true},                                 // within the interval: counted
		{ms: 200, fail: false},                                // a short run ends: no line
		{ms: 300, fail: true},                                 // still within the interval
		{ms: 1000, fail: true, log: true, skipped: 2},         // the interval passed: the two skipped
		{ms: 1500, fail: true},                                //
		{ms: 2100, fail: true, log: true, skipped: 1},         //
		{ms: 2200, fail: false, run: 1900 * time.Millisecond}, // a run of 1.9s (from 300ms) ends
		{ms: 5000, fail: true, log: true},                     // a quiet spell: at once again
	} {
		now := at(s.ms)
		if s.fail {
			log, n := l.failed(now)
			if log != s.log || n != s.skipped {
				t.Fatalf("step %d (%dms): failed = %v, %d; want %v, %d", i, s.ms, log, n, s.log, s.skipped)
			}
			continue
		}
		if d := l.succeeded(now); d != s.run {
			t.Fatalf("step %d (%dms): succeeded = %v, want %v", i, s.ms, d, s.run)
		}
	}
}
