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
