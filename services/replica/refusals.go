package replica

import (
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
)

// Refused-connection backoff shared by a replica's fetch loops.
const (
	refusedWaitMin = 20 * time.Millisecond
	refusedWaitMax = 200 * time.Millisecond
)

// refusals remembers, per leader address, that it refuses connections, so
// a replica that follows a dead leader in many ranges dials it once per
// wait, not once per range per wait. Measured before it: when a replica
// leading ~800 ranges was killed, the survivors' ~1,600 fetch loops spent
// 27% of the failover's CPU dialing the dead address, slowing every
// promotion that was moving those ranges away. One loop probes the address
// per wait; the others sleep until it answers or the next probe is due. The
// wait is capped at 200ms, so a leader that comes back (or a new one at the
// same address) is found within that.
type refusals struct {
	mu sync.Mutex
	m  map[string]*refusal
}

type refusal struct {
	next time.Time     // when the address may be dialed again
	wait time.Duration // the current wait between probes
}

// hold returns how long a fetch loop should wait before dialing addr: 0
// when the address is not known to refuse, or when this caller takes the
// next probe (which pushes the others' next chance one wait later).
func (r *refusals) hold(addr string, now time.Time) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	x := r.m[addr]
	if x == nil {
		return 0
	}
	if now.Before(x.next) {
		return x.next.Sub(now)
	}
	x.next = now.Add(x.wait)
	return 0
}

// observe records the outcome of a fetch to addr: a refused connection
// doubles the address's wait (up to the cap); anything that reached the
// server clears it.
func (r *refusals) observe(addr string, err error, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !isRefused(err) {
		delete(r.m, addr)
		return
	}
	if r.m == nil {
		r.m = map[string]*refusal{}
	}
	x := r.m[addr]
	if x == nil {
		x = &refusal{}
		r.m[addr] = x
	}
	x.wait = min(max(x.wait*2, refusedWaitMin), refusedWaitMax)
	x.next = now.Add(x.wait)
}

// isRefused reports a dial refused by the peer's host: nothing listens at
// the address, so nothing was sent.
func isRefused(err error) bool {
	return err != nil && connect.CodeOf(err) == connect.CodeUnavailable && strings.Contains(err.Error(), "connection refused")
}
