package promoter

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// A planned Promote to a follower while appends are flowing ends with that
// follower leading and loses no acknowledged record. The target is always
// a few records behind the leader's log end while appends flow, so the
// plan's "most complete log" alone kept the old leader nearly every time:
// the handover must wait for the target and make it lead from its shorter
// log (handover.go).
func TestPlannedPromoteWhileAppending(t *testing.T) {
	for _, n := range []int{3, 5} {
		t.Run(fmt.Sprintf("replicas=%d", n), func(t *testing.T) { plannedPromoteWhileAppending(t, n) })
	}
}

// plannedPromoteWhileAppending is TestPlannedPromoteWhileAppending with n
// replicas. With five, fencing the others first leaves the leader without
// a quorum: it commits nothing until the target leads.
func plannedPromoteWhileAppending(t *testing.T, n int) {
	c := newCluster(t, n)
	c.createRange("r", "r1")
	p := c.newPromoter("p1", true)
	leader, e1 := c.leader("r", 1, 20*time.Second)
	waitFor(t, "the promoter to be elected", 10*time.Second, p.Elected)
	target := "r2"
	if leader == target {
		target = "r3"
	}

	var mu sync.Mutex
	var acks []acked
	stop := make(chan struct{})
	var wg sync.WaitGroup
	// The writers stop before the cluster does, also when the test fails.
	stopWriters := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopWriters()
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 10_000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				// An append that fails has an unknown outcome; only
				// acknowledged ones are checked.
				if a, err := c.appendOne("r", fmt.Sprintf("w%d-%d", w, i), 5*time.Second); err == nil {
					mu.Lock()
					acks = append(acks, a)
					mu.Unlock()
				}
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	var resp *connect.Response[tenurev1.PromoteResponse]
	var err error
	for attempt := 0; attempt < 50; attempt++ {
		resp, err = handler{p}.Promote(ctx, connect.NewRequest(&tenurev1.PromoteRequest{RangeId: "r", PreferredReplicaId: target, Reason: "planned handover"}))
		if connect.CodeOf(err) != connect.CodeUnavailable { // not the loop's own promotion still running
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	if err != nil {
		t.Fatalf("Promote(to %s): %v", target, err)
	}
	tr := resp.Msg.GetTransition()
	// Each promotion that lands elsewhere is retried, within a bound.
	if tr.GetEpoch() <= e1 || tr.GetEpoch() > e1+handoverAttempts {
		t.Errorf("planned promotion epoch = %d, want %d to %d", tr.GetEpoch(), e1+1, e1+handoverAttempts)
	}
	if tr.GetLeaderId() != target {
		t.Fatalf("Promote(to %s) made %s the leader (handover refused: %q)", target, tr.GetLeaderId(), tr.GetHandoverRefused())
	}
	time.Sleep(300 * time.Millisecond)
	stopWriters()
	mu.Lock()
	defer mu.Unlock()
	if len(acks) == 0 {
		t.Fatal("no append was acknowledged")
	}
	t.Logf("planned handover %s -> %s at epoch %d (took %v, steps %v); %d appends acknowledged around it", leader, tr.GetLeaderId(), tr.GetEpoch(), time.Duration(tr.GetDurationUs())*time.Microsecond, tr.GetTimings(), len(acks))
	// The replicas say so too, not only the transition: the target leads
	// at the epoch the handover made, or a later one only if nobody else
	// promoted meanwhile (the test's promoter runs no other promotion).
	if got, e := c.leader("r", tr.GetEpoch(), 10*time.Second); got != target || e != tr.GetEpoch() {
		t.Fatalf("after the handover %s leads at epoch %d, want %s at %d", got, e, target, tr.GetEpoch())
	}
	c.checkAcked("r", acks)
}

// A planned handover that cannot land is refused before anything is
// fenced, naming why, and the range keeps its leader at its epoch: a
// target that is down, and one that cannot catch up within the bound.
func TestPlannedHandoverRefusals(t *testing.T) {
	c := newCluster(t, 3)
	c.createRange("r", "r1")
	p := c.newPromoter("p1", true, func(cfg *Config) { cfg.HandoverCatchUp = 500 * time.Millisecond })
	leader, e1 := c.leader("r", 1, 20*time.Second)
	waitFor(t, "the promoter to be elected", 10*time.Second, p.Elected)
	var others []string
	for _, id := range []string{"r1", "r2", "r3"} {
		if id != leader {
			others = append(others, id)
		}
	}
	promote := func(to string) error {
		t.Helper()
		var err error
		for attempt := 0; attempt < 50; attempt++ {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err = handler{p}.Promote(ctx, connect.NewRequest(&tenurev1.PromoteRequest{RangeId: "r", PreferredReplicaId: to}))
			cancel()
			if connect.CodeOf(err) != connect.CodeUnavailable { // not the loop's own promotion still running
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		return err
	}
	check := func(to, why string, err error) {
		t.Helper()
		if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), why) {
			t.Fatalf("Promote(to %s) = %v, want failed precondition saying %q", to, err, why)
		}
		var detail *tenurev1.HandoverRefused
		var ce *connect.Error
		if errors.As(err, &ce) {
			for _, d := range ce.Details() {
				if m, derr := d.Value(); derr == nil {
					if h, ok := m.(*tenurev1.HandoverRefused); ok {
						detail = h
					}
				}
			}
		}
		if detail.GetTargetId() != to || detail.GetLeaderId() != leader || detail.GetEpoch() != e1 || detail.GetPromoted() {
			t.Errorf("Promote(to %s) detail = %v, want target %s, leader %s at %d, nothing promoted", to, detail, to, leader, e1)
		}
		if got, e := c.leader("r", 1, 10*time.Second); got != leader || e != e1 {
			t.Fatalf("after the refused handover to %s, %s leads at epoch %d; want %s still at %d", to, got, e, leader, e1)
		}
	}

	// A target that is partitioned from the leader: it answers, but does
	// not fetch, and never catches up.
	c.byID[others[0]].gate.Close()
	if _, err := c.appendOne("r", "while partitioned", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	check(others[0], "not caught up within 500ms", promote(others[0]))
	c.byID[others[0]].gate.Open()

	// A target that is down.
	c.stop(c.byID[others[1]])
	check(others[1], "does not answer", promote(others[1]))
}

// A planned handover to a live replica that does not host the range yet
// (it was down when the range was made, and the promoter has not brought
// it in since) waits for the reconcile loop to fence, adopt and catch it
// up, then hands over. It was refused at once ("does not answer:
// not_found"), and the operator had to retry by hand.
func TestPlannedHandoverWaitsForATargetNotHostingYet(t *testing.T) {
	c := newCluster(t, 3)
	r3 := c.byID["r3"]
	c.stop(r3)
	c.createRange("r", "r1")
	// The promoter's fences and adoptions of r3 wait until released: r3
	// stays without the range, deterministically, until the handover has
	// begun.
	hold := &holdReconcile{rt: transport.NewHTTPClient().Transport, host: r3.listen, release: make(chan struct{})}
	p := c.newPromoter("p1", true, func(cfg *Config) {
		cfg.HTTPClient = &http.Client{Transport: hold}
		cfg.HandoverCatchUp = 10 * time.Second
	})
	_, e1 := c.leader("r", 1, 20*time.Second)
	waitFor(t, "the promoter to be elected", 10*time.Second, p.Elected)
	if _, err := c.appendOne("r", "before", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	c.start(r3)
	waitFor(t, "r3 to answer that it does not host r", 10*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := c.replicaClient(r3.srv.URL()).GetStatus(ctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: "r"}))
		return connect.CodeOf(err) == connect.CodeNotFound
	})
	released := time.AfterFunc(500*time.Millisecond, func() { close(hold.release) })
	defer released.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := promoteRetrying(ctx, t, handler{p}, &tenurev1.PromoteRequest{RangeId: "r", PreferredReplicaId: "r3", Reason: "planned handover"})
	if err != nil {
		t.Fatalf("Promote(to r3, which did not host the range yet): %v", err)
	}
	tr := resp.GetTransition()
	if tr.GetLeaderId() != "r3" || tr.GetEpoch() <= e1 {
		t.Fatalf("Promote(to r3) made %s leader at epoch %d (handover refused: %q); want r3 after epoch %d", tr.GetLeaderId(), tr.GetEpoch(), tr.GetHandoverRefused(), e1)
	}
	if got, e := c.leader("r", tr.GetEpoch(), 10*time.Second); got != "r3" {
		t.Fatalf("after the handover %s leads at epoch %d, want r3", got, e)
	}
	if _, err := c.appendOne("r", "after", 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

// holdReconcile holds the fences and adoptions sent to host until release
// is closed (or the call's context ends), and lets everything else by.
type holdReconcile struct {
	rt      http.RoundTripper
	host    string
	release chan struct{}
}

func (h *holdReconcile) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Host == h.host && (strings.Contains(req.URL.Path, "/Fence") || strings.Contains(req.URL.Path, "/Adopt")) {
		select {
		case <-h.release:
		case <-req.Context().Done():
			return nil, req.Context().Err()
		}
	}
	return h.rt.RoundTrip(req)
}

// A Promote refused before it changed anything (a preferred replica that
// is no member) is the operator's error, not the range's state: the
// healthy range stays shown healthy, where it was shown unavailable until
// the next promotion.
func TestRefusedPromoteLeavesTheRangeHealthy(t *testing.T) {
	c := newCluster(t, 3)
	c.createRange("r", "r1")
	p := c.newPromoter("p1", true)
	_, e1 := c.leader("r", 1, 20*time.Second)
	state := func() *tenurev1.RangePromotionState {
		resp, err := handler{p}.GetStatus(context.Background(), connect.NewRequest(&tenurev1.PromoterServiceGetStatusRequest{}))
		if err != nil || len(resp.Msg.GetRanges()) != 1 {
			t.Fatalf("GetStatus = %v, %v; want range r", resp, err)
		}
		return resp.Msg.GetRanges()[0]
	}
	waitFor(t, "r healthy at its first epoch", 10*time.Second, func() bool {
		st := state()
		return st.GetState() == "healthy" && st.GetEpoch() == e1 && st.GetLeaderId() != ""
	})
	var err error
	for attempt := 0; attempt < 50; attempt++ {
		_, err = handler{p}.Promote(context.Background(), connect.NewRequest(&tenurev1.PromoteRequest{RangeId: "r", PreferredReplicaId: "r9"}))
		if connect.CodeOf(err) != connect.CodeUnavailable { // not a promotion of the loop's still running
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("Promote(preferred r9) = %v, want invalid argument", err)
	}
	if st := state(); st.GetState() != "healthy" || st.GetLastError() != "" || st.GetEpoch() != e1 {
		t.Fatalf("after the refused Promote r is %q at epoch %d (last error %q), want healthy at %d with no error", st.GetState(), st.GetEpoch(), st.GetLastError(), e1)
	}
}

// Promoting a range to the replica that already leads it with a live lease
// does nothing and says so (it spent an epoch and said nothing); force
// promotes anyway.
func TestPromoteToTheLeaderDoesNothingUnlessForced(t *testing.T) {
	c := newCluster(t, 3)
	c.createRange("r", "r1")
	p := c.newPromoter("p1", true)
	leader, e1 := c.leader("r", 1, 20*time.Second)
	waitFor(t, "the lease service to see the leader's lease live", 10*time.Second, func() bool {
		resp, err := c.lease.Client.GetRange(context.Background(), connect.NewRequest(&tenurev1.GetRangeRequest{RangeId: "r"}))
		if err != nil {
			return false
		}
		l := resp.Msg.GetRange().GetLease()
		return l.GetHolderId() == leader && l.GetLive() && l.GetEpoch() == e1
	})
	promote := func(force bool) *tenurev1.PromoteResponse {
		t.Helper()
		var resp *connect.Response[tenurev1.PromoteResponse]
		var err error
		for attempt := 0; attempt < 50; attempt++ {
			resp, err = handler{p}.Promote(context.Background(), connect.NewRequest(&tenurev1.PromoteRequest{RangeId: "r", PreferredReplicaId: leader, Force: force}))
			if connect.CodeOf(err) != connect.CodeUnavailable { // not the loop's own promotion still running
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("Promote(preferred %s, force %v): %v", leader, force, err)
		}
		return resp.Msg
	}
	if got := promote(false); got.GetAlreadyLeaderId() != leader || got.GetAlreadyLeaderEpoch() != e1 || got.GetTransition() != nil {
		t.Fatalf("Promote(preferred %s, the leader) = %v; want already leading at %d, no transition", leader, got, e1)
	}
	if l, e := c.leader("r", 1, 10*time.Second); l != leader || e != e1 {
		t.Fatalf("after the no-op Promote %s leads at epoch %d, want %s still at %d", l, e, leader, e1)
	}
	if got := promote(true).GetTransition(); got.GetEpoch() != e1+1 || got.GetLeaderId() != leader {
		t.Fatalf("Promote(preferred %s, force) = leader %s at %d, want %s at %d", leader, got.GetLeaderId(), got.GetEpoch(), leader, e1+1)
	}
}

// A leader that dies while a planned handover waits for its target does
// not strand the handover: the failover runs (the wait holds no in-flight
// mark), the wait sees the range move on, and the handover lands on the
// target from the new leader once the target catches up.
func TestPlannedHandoverSurvivesLeaderDeath(t *testing.T) {
	c := newCluster(t, 3)
	c.createRange("r", "r1")
	p := c.newPromoter("p1", true, func(cfg *Config) { cfg.HandoverCatchUp = 8 * time.Second })
	leader, e1 := c.leader("r", 1, 20*time.Second)
	waitFor(t, "the promoter to be elected", 10*time.Second, p.Elected)
	target := "r2"
	if leader == target {
		target = "r3"
	}
	// The target falls behind: partitioned from the leader while appends
	// are acknowledged by the other two.
	c.byID[target].gate.Close()
	for i := range 5 {
		if _, err := c.appendOne("r", fmt.Sprintf("behind-%d", i), 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	type result struct {
		tr  *tenurev1.Transition
		err error
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		resp, err := handler{p}.Promote(ctx, connect.NewRequest(&tenurev1.PromoteRequest{RangeId: "r", PreferredReplicaId: target}))
		if err != nil {
			done <- result{nil, err}
			return
		}
		done <- result{resp.Msg.GetTransition(), nil}
	}()
	time.Sleep(300 * time.Millisecond)
	c.stop(c.byID[leader])
	c.byID[target].gate.Open()
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("Promote(to %s) with leader %s killed during the wait: %v", target, leader, r.err)
		}
		if r.tr.GetLeaderId() != target || r.tr.GetEpoch() <= e1+1 {
			t.Fatalf("Promote(to %s) = leader %s at epoch %d; want %s above the failover's epoch %d", target, r.tr.GetLeaderId(), r.tr.GetEpoch(), target, e1+1)
		}
		t.Logf("handover to %s landed at epoch %d, %v after it was asked, across %s's death", target, r.tr.GetEpoch(), time.Since(start), leader)
	case <-time.After(30 * time.Second):
		t.Fatal("Promote did not return")
	}
	if got, _ := c.leader("r", e1+2, 10*time.Second); got != target {
		t.Fatalf("%s leads after the handover, want %s", got, target)
	}
}
