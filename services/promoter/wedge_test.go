package promoter

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/embedetcd"
	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/lease"
	"github.com/tenurelog/tenure/services/lease/leasetest"
)

// pausable is an http.Handler that stands still while paused, as a lease
// service process under SIGSTOP does: a request that arrives waits, and an
// answer being written (a WatchLeases stream's next event) waits too, until
// resume. Nothing is refused or failed: callers see only time passing, and
// etcd, which runs on, expires the sessions nobody renews.
type pausable struct {
	next http.Handler
	mu   sync.Mutex
	// resumed is closed while running; a fresh open channel while paused.
	resumed chan struct{}
}

func newPausable(next http.Handler) *pausable {
	p := &pausable{next: next, resumed: make(chan struct{})}
	close(p.resumed)
	return p
}

func (p *pausable) pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.resumed = make(chan struct{})
}

func (p *pausable) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.resumed:
	default:
		close(p.resumed)
	}
}

// wait blocks while paused, or until ctx ends (the caller gave up).
func (p *pausable) wait(ctx context.Context) {
	p.mu.Lock()
	ch := p.resumed
	p.mu.Unlock()
	select {
	case <-ch:
	case <-ctx.Done():
	}
}

func (p *pausable) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.wait(r.Context())
	p.next.ServeHTTP(&pausedWriter{ResponseWriter: w, p: p, ctx: r.Context()}, r)
}

// pausedWriter holds an answer's bytes while the handler is paused.
type pausedWriter struct {
	http.ResponseWriter
	p   *pausable
	ctx context.Context
}

func (w *pausedWriter) Write(b []byte) (int, error) {
	w.p.wait(w.ctx)
	return w.ResponseWriter.Write(b)
}

func (w *pausedWriter) Flush() {
	w.p.wait(w.ctx)
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *pausedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// startPausableLease starts etcd and a lease service whose handler can be
// paused.
func startPausableLease(t *testing.T) (*leasetest.Env, *pausable) {
	t.Helper()
	e, err := embedetcd.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	cli := leasetest.EtcdClient(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	svc, err := lease.New(ctx, cli)
	if err != nil {
		t.Fatal(err)
	}
	reg := svc.Registration()
	gate := newPausable(reg.Handler)
	reg.Handler = gate
	srv, err := transport.Serve("127.0.0.1:0", reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		gate.resume() // let paused calls end, or Close would wait for them
		svc.Close()
		srv.Close()
	})
	return &leasetest.Env{Etcd: e, EtcdClient: cli, Service: svc, Server: srv, Client: leasetest.Client(srv.URL())}, gate
}

// newClusterOn is newCluster on a lease service the test made.
func newClusterOn(t *testing.T, n int, env *leasetest.Env) *cluster {
	t.Helper()
	return startCluster(t, &cluster{fetchWait: 200 * time.Millisecond, lease: env}, n)
}

// wedgeTTL is every session's TTL in the wedge test: the replicas' keepers
// (cluster.start) and the promoter's own.
const wedgeTTL = 2 * time.Second

// healBound is how long after the lease service comes back the range must
// serve again. The keeper notices its session is gone at its next renewal
// (a third of the TTL), opens a new one, the promoter promotes on the
// expiry (well under a second) and the keeper sees the new bind at its next
// renewal (another third). Whatever order those came in, the promoter's
// own rule converges too: a leader seen not serving for a TTL is given a
// rebind, and after another TTL without serving a promotion; each is seen
// at a full status probe (StatusInterval, 1 s). So 2 TTLs + 2 status
// intervals, plus 2 s for the promotion and scheduling under -race.
const healBound = 2*wedgeTTL + 2*time.Second + 2*time.Second

// TestLeaseServicePauseDoesNotWedge is issue 31's wedge: the lease service
// stands still (SIGSTOP) for a while around the session TTL and comes back.
// Every session expired meanwhile; the promoter, told the lease expired,
// fences the old leader and adopts it again at a new epoch, while the
// leader's keeper notices its session is gone, drops that session's leases
// and opens a new one, which the promoter's bind then lands on. In
// whichever order that happened, the range must serve again: an
// acknowledged append and a committed read within healBound, and the
// promoter must not call a range healthy whose leader refuses. Before the
// fix the leader stayed LEADER with lease_valid=false for good, with the
// lease service showing its lease live and held by it, and the promoter
// reporting the range healthy.
func TestLeaseServicePauseDoesNotWedge(t *testing.T) {
	env, gate := startPausableLease(t)
	c := newClusterOn(t, 3, env)
	c.createRange("r", "r1")
	p := c.newPromoter("p1", true, func(cfg *Config) { cfg.SessionTTL = wedgeTTL })
	if _, err := c.appendOne("r", "before", 20*time.Second); err != nil {
		t.Fatal(err)
	}
	// Around the TTL, as issue 31 saw wedge at 1.4, 1.5 and 2.25 TTLs.
	for i, pause := range []time.Duration{wedgeTTL * 14 / 10, wedgeTTL * 3 / 2, wedgeTTL * 9 / 4} {
		gate.pause()
		time.Sleep(pause)
		gate.resume()
		healed := time.Now()
		value := fmt.Sprintf("after pause %d of %v", i, pause)
		if err := c.servesWithin("r", value, healBound); err != nil {
			t.Errorf("after a %v pause of the lease service: %v\n%s", pause, err, c.describe(p, "r"))
			continue
		}
		t.Logf("pause %v: the range served again %v after the lease service came back", pause, time.Since(healed).Round(time.Millisecond))
		// The promoter's view agrees with the replicas': the leader it
		// calls healthy is the one serving, at its epoch. (Within one
		// full status probe, a second, plus slack.)
		agree := func() bool {
			st := promotionState(p, "r")
			if c.byID[st.GetLeaderId()] == nil {
				return false
			}
			l := c.status(st.GetLeaderId(), "r")
			return st.GetState() == "healthy" && l.GetRole() == tenurev1.Role_ROLE_LEADER && l.GetEpoch() == st.GetEpoch() && l.GetLeaseValid()
		}
		deadline := time.Now().Add(notServingSeen)
		for !agree() && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if !agree() {
			t.Errorf("after a %v pause the promoter's view disagrees with the replicas'\n%s", pause, c.describe(p, "r"))
		}
	}
}

// servesWithin checks that rangeID acknowledges an append of value and then
// serves it in a committed read, both within d.
func (c *cluster) servesWithin(rangeID, value string, d time.Duration) error {
	deadline := time.Now().Add(d)
	a, err := c.appendOne(rangeID, value, d)
	if err != nil {
		return err
	}
	var last error
	for time.Now().Before(deadline) {
		for _, tr := range c.replicas {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			resp, err := c.log_(tr.srv.URL()).Read(ctx, connect.NewRequest(&tenurev1.ReadRequest{RangeId: rangeID, Offset: a.offset}))
			cancel()
			if err != nil {
				last = err
				continue
			}
			if recs := resp.Msg.GetRecords(); len(recs) > 0 && recs[0].GetOffset() == a.offset && string(recs[0].GetValue()) == value {
				return nil
			}
			last = fmt.Errorf("read at %d from %s: %d records, not the acknowledged one", a.offset, tr.id, len(resp.Msg.GetRecords()))
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("acknowledged %q at %d, but no committed read of it within %v: %w", value, a.offset, d, last)
}

// describe says what every replica, the lease service and the promoter
// think of rangeID, for a failure message.
func (c *cluster) describe(p *Promoter, rangeID string) string {
	out := ""
	for _, tr := range c.replicas {
		out += fmt.Sprintf("%s: %v\n", tr.id, c.status(tr.id, rangeID))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if resp, err := c.lease.Client.GetLease(ctx, connect.NewRequest(&tenurev1.GetLeaseRequest{RangeId: rangeID})); err == nil {
		out += fmt.Sprintf("lease: %v\n", resp.Msg.GetLease())
	} else {
		out += fmt.Sprintf("lease: %v\n", err)
	}
	if resp, err := (handler{p}).GetStatus(ctx, connect.NewRequest(&tenurev1.PromoterServiceGetStatusRequest{})); err == nil {
		for _, st := range resp.Msg.GetRanges() {
			if st.GetRangeId() == rangeID {
				out += fmt.Sprintf("promoter: %v\n", st)
			}
		}
	}
	return out
}
