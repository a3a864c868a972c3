package promoter

import (
	"context"
	"crypto/rand"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenurelog/tenure/internal/fanout"
	"github.com/tenurelog/tenure/pkg/appender"
	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// Mass failover under load (issue 29): appends run on every range while
// the replica leading a third of them is killed. The load is what a real
// producer does: AppendStreams through pkg/appender, one per replica, and
// per range one idempotent producer (docs/idempotence.md) with one append
// in flight, which follows a not-leader answer to the leader it names and
// otherwise tries the next replica. Only acknowledged appends count; each
// is checked afterwards, by its bytes, at its offset on the range's leader.

// TestMassFailoverUnderLoad is BenchmarkMassFailover/loaded-third at
// massRanges() (200 under -race, in make test): appends on every range, the
// replica leading a third killed; nothing acknowledged is lost or written
// twice, and every victim is promoted exactly once by the failover (a
// promotion displacing the killed leader); promotions that displace a
// surviving leader whose lease lapsed under the load are logged, not
// failed (see failoverPromotions).
//
// It asserts no speed. The only bound on the failover is how long
// waitReled waits for every victim to be re-led, massReledWithin (60 s):
// the benchmark's target is 2 s at 1,000 ranges without the detector,
// while here the detector slows the in-process cluster (etcd, the lease
// service, three replicas and a promoter) by an order of magnitude and
// make test shares two cores with other packages; 60 s is far above any
// healthy run and still ends a wedged failover well inside the package's
// timeout.
func TestMassFailoverUnderLoad(t *testing.T) {
	res := massFailoverUnderLoad(t, massRanges(), time.Second)
	res.logProblems(t)
	if res.lost > 0 || res.dups > 0 || res.unread > 0 {
		t.Errorf("%d acknowledged records lost, %d values written twice (of %d acknowledged); %d ranges unreadable", res.lost, res.dups, res.acks, res.unread)
	}
	if len(res.bad) > 0 {
		t.Errorf("transition records: %d ranges promoted twice by the failover, %d victims without a promotion, %d other ranges displaced the killed leader: %v",
			res.doubles, res.missing, res.moved, res.bad[:min(len(res.bad), 10)])
	}
	// A surviving leader that lost its lease under the load (its
	// keep-alives starved on a busy machine) is promoted away from: not
	// the failover promoting twice, and not asserted; logged, as the
	// benchmark reports it (relost).
	if res.relost > 0 {
		t.Logf("%d promotions displaced a surviving leader (its lease lapsed under load), e.g. %v", res.relost, res.relostWhy[:min(len(res.relostWhy), 3)])
	}
	// A load that acknowledged nothing after the kill checked nothing.
	if res.windowAcks == 0 || res.victimAcks == 0 {
		t.Errorf("no appends acknowledged after the kill (%d) or on the victims' ranges (%d): the failover was not under load", res.windowAcks, res.victimAcks)
	}
}

// massLoad drives appends on every range of a cluster until stopped.
type massLoad struct {
	ranges []*rangeLoad
	// apps appends to each replica, at the address it had when the load
	// started: the producers never read the cluster's testReplica fields,
	// which the test goroutine rewrites when it stops a replica.
	apps  map[string]*appender.Appender
	order []string // replica ids, for "the next replica"
	start time.Time
	stop  context.CancelFunc
	wg    sync.WaitGroup
}

// rangeLoad is one range's producer. Its fields are written only by its
// goroutine, and read after massLoad.halt has waited for it.
type rangeLoad struct {
	id   string
	prod []byte // the producer id: 16 random bytes
	acks []loadAck
	// fails counts tries not acknowledged (refused, unknown outcome, no
	// server): retried, and not counted as acked.
	fails int
	// nacked is len(acks), for the test goroutine while the load runs.
	nacked atomic.Int64
}

// loadAck is one acknowledged append: the value, where it was written and
// under which epoch, and when the acknowledgement arrived.
type loadAck struct {
	acked
	epoch uint64
	at    time.Time
}

// maxLoad bounds how long a load runs if the test never stops it (a
// failure between start and halt): every producer loop ends by then.
const maxLoad = 10 * time.Minute

// startLoad starts one producer per range in ids, each appending first to
// the replica leaders names (any replica if none) and then wherever
// leadership goes.
func (c *cluster) startLoad(ids []string, leaders map[string]string) *massLoad {
	c.t.Helper()
	l := &massLoad{apps: map[string]*appender.Appender{}}
	for _, tr := range c.replicas {
		if tr.srv == nil {
			continue
		}
		// Plain appends: each request below carries its own producer
		// fields (AppendRequest sends them as they are), and the retry
		// after an unknown outcome is the producer loop's, at whichever
		// replica leads then, not the Appender's, which would retry the
		// same (perhaps dead) replica for seconds.
		l.apps[tr.id] = appender.New(c.log_(tr.srv.URL()), appender.WithoutIdempotence())
		l.order = append(l.order, tr.id)
	}
	ctx, cancel := context.WithTimeout(context.Background(), maxLoad)
	l.stop, l.start = cancel, time.Now()
	for _, id := range ids {
		rl := &rangeLoad{id: id, prod: make([]byte, 16)}
		_, _ = rand.Read(rl.prod) // never fails (Go 1.24)
		l.ranges = append(l.ranges, rl)
		first := leaders[id]
		if l.apps[first] == nil {
			first = l.order[0]
		}
		l.wg.Go(func() { l.produce(ctx, rl, first) })
	}
	return l
}

// produce appends to rl's range, one append in flight, until ctx ends.
// Sequence s always carries the value "<range>-<s>": an append whose
// outcome is unknown is sent again with the same sequence and bytes, at
// whoever leads then, and the leader writes it at most once.
func (l *massLoad) produce(ctx context.Context, rl *rangeLoad, leader string) {
	id := leader
	var seq uint64
	follows := 0 // not-leader answers followed since the last pause
	// failed is the replica the last try before a pause failed at ("":
	// none since the last acknowledgement).
	failed := ""
	for ctx.Err() == nil {
		value := fmt.Sprintf("%s-%d", rl.id, seq)
		req := &tenurev1.AppendRequest{RangeId: rl.id, Records: [][]byte{[]byte(value)}, ProducerId: rl.prod, FirstSequence: seq}
		// 2 s per try: a leader killed mid-append answers at once (its
		// connections drop); this bounds a try against one that hangs.
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		ack, err := l.apps[id].AppendRequest(cctx, req)
		cancel()
		if err == nil {
			rl.acks = append(rl.acks, loadAck{acked{ack.GetBaseOffset(), value}, ack.GetEpoch(), time.Now()})
			rl.nacked.Add(1)
			seq++
			follows, failed = 0, ""
			continue
		}
		if ctx.Err() != nil {
			return
		}
		rl.fails++
		// A replica that does not lead names the leader it knows: that
		// refusal wrote nothing, so go there at once, a few times in a
		// row at most (names can be stale while leadership moves), and
		// not back to the replica that failed before it: a follower that
		// has not heard of the failover yet names the killed leader.
		if nl := wire.NotLeader(err); nl.GetLeaderId() != "" && nl.GetLeaderId() != id && nl.GetLeaderId() != failed &&
			l.apps[nl.GetLeaderId()] != nil && follows < 3 {
			id = nl.GetLeaderId()
			follows++
			continue
		}
		// Anything else (no leader known yet, a dead replica, a deposed
		// leader, a leader not yet serving): the next replica, after a
		// pause, so a range with no leader for a while costs 50 tries a
		// second, not a spin.
		failed = id
		id = l.order[(slices.Index(l.order, id)+1)%len(l.order)]
		follows = 0
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// halt stops every producer, waits for them and closes the streams.
func (l *massLoad) halt() {
	l.stop()
	l.wg.Wait()
	for _, a := range l.apps {
		a.Close()
	}
}

// count is how many appends were acknowledged so far; safe while the load
// runs.
func (l *massLoad) count() int64 {
	var n int64
	for _, rl := range l.ranges {
		n += rl.nacked.Load()
	}
	return n
}

// acks counts the acknowledgements that arrived in [from, to).
func (l *massLoad) acks(from, to time.Time) int {
	n := 0
	for _, rl := range l.ranges {
		for _, a := range rl.acks {
			if !a.at.Before(from) && a.at.Before(to) {
				n++
			}
		}
	}
	return n
}

// massReledWithin bounds the wait for every victim to be re-led under
// load (see TestMassFailoverUnderLoad for why 60 s).
const massReledWithin = 60 * time.Second

// massLoadResult is what one loaded mass failover measured.
type massLoadResult struct {
	ranges, victims int
	// allReled is the kill to the end of the last victim's adoption, from
	// the transition records; seen when the test's poll saw every victim
	// led at a new epoch by a survivor; appending when the last victim
	// range had its first append acknowledged under its new epoch.
	allReled, seen, appending time.Duration
	// cpu is the whole process's CPU time from the kill to seen.
	cpu time.Duration
	// acks is every acknowledgement; windowAcks those from the kill to
	// the end of the load; victimAcks those of victim ranges after the
	// kill.
	acks, windowAcks, victimAcks int
	// fails counts tries not acknowledged (refused, unknown outcome, no
	// server), each retried.
	fails int
	// before and after are the acknowledgements per second in the steady
	// stretch before the kill (every producer past its first append), and
	// from seen to the load's end.
	before, after float64
	// lost: acknowledged records missing or different at their offset;
	// dups: a load value written at two offsets (each sequence is written
	// at most once); unread: ranges that could not be read back, whose
	// acknowledgements are then unchecked (not counted as lost).
	lost, dups, unread int
	promotions
	// problems says which, by kind: lost, dup, unread, stalled (a victim
	// range with no append acknowledged under a new epoch).
	problems map[string][]string
}

// problem notes one problem of a kind.
func (r *massLoadResult) problem(kind, format string, args ...any) {
	if r.problems == nil {
		r.problems = map[string][]string{}
	}
	r.problems[kind] = append(r.problems[kind], fmt.Sprintf(format, args...))
}

// logProblems logs up to 10 problems of each kind, as errors.
func (r *massLoadResult) logProblems(tb testing.TB) {
	tb.Helper()
	for _, kind := range []string{"lost", "dup", "unread", "stalled"} {
		ps := r.problems[kind]
		for _, p := range ps[:min(len(ps), 10)] {
			tb.Errorf("%s: %s", kind, p)
		}
		if len(ps) > 10 {
			tb.Errorf("%s: and %d more", kind, len(ps)-10)
		}
	}
}

// massFailoverUnderLoad runs the scenario on a new cluster of three
// replicas: n ranges, leaders spread evenly (r1 leads ranges 0, 3, 6, ...,
// so a third), a producer on every range, r1 killed, measured until every
// one of its ranges is led at a new epoch by a survivor, then every
// acknowledgement checked. The load runs for after before the kill (once
// every range had an append acknowledged) and at least after once every
// victim is re-led.
func massFailoverUnderLoad(tb testing.TB, n int, after time.Duration) massLoadResult {
	c := newClusterWait(tb, 3, time.Second)
	ids := make([]string, n)
	want := map[string]string{}
	for i := range ids {
		ids[i] = fmt.Sprintf("m%04d", i)
		want[ids[i]] = fmt.Sprintf("r%d", i%3+1)
		c.createRange(ids[i], want[ids[i]])
	}
	// Room for a burst of fsyncs at the setup, as in TestMassFailover.
	p := c.newPromoter("p1", true, func(cfg *Config) {
		cfg.FenceTimeout, cfg.RPCTimeout = 10*time.Second, 10*time.Second
	})
	// Each range is created with its wanted leader preferred, but a first
	// promotion prefers it only among the replicas that answered in time:
	// planned promotions place the ranges that landed elsewhere.
	//
	// A range may still move after it was placed (a lease that expired
	// under a burst: its leader's keep-alive starved): place and settle
	// again, a bounded number of times, until r1 leads exactly its third.
	var victim string
	var victims ledAt
	for try := 1; ; try++ {
		c.leadEach(p, ids, func(r string) string { return want[r] })
		victim, victims, _ = c.settleOn(p, ids, "r1")
		if len(victims) == (n+2)/3 {
			break
		}
		if try == 5 {
			tb.Fatalf("after %d placements r1 leads %d of %d ranges, want %d: not the scenario measured", try, len(victims), n, (n+2)/3)
		}
	}
	_, leaders := c.leaders()
	tb.Logf("placed and settled: r1 leads %d of %d ranges; starting the load", len(victims), n)
	l := c.startLoad(ids, leaders)
	defer l.halt() // on a failure below; halting twice is harmless

	// The kill lands on a loaded cluster: wait (bounded) until every
	// range has had an append acknowledged, so every producer is past its
	// first stream's setup.
	waitFor(tb, "an acknowledged append on every range", 60*time.Second, func() bool {
		for _, rl := range l.ranges {
			if rl.nacked.Load() == 0 {
				return false
			}
		}
		return true
	})
	warm := time.Now()
	tb.Logf("every range acknowledged an append %v after the load started (%d acks)", warm.Sub(l.start), l.count())
	// A steady stretch first: the rate in it is the load the failover
	// interrupts.
	time.Sleep(after)
	// What moved while the load started (a leader whose lease lapsed
	// under it) is not the failover's: the victims, every range's leader
	// and epoch, and the records so far are read again here, just before
	// the kill, and only promotions above these epochs count. (Placing
	// again under the load was tried: at 1,000 ranges its etcd reads,
	// slowed by the load, took minutes.)
	epochAt, leaders := c.leaders()
	victims = ledAt{}
	for r, id := range leaders {
		if id == victim {
			victims[r] = epochAt[r]
		}
	}
	before := p.countAllTransitions(tb)
	tb.Logf("%d acks so far; r1 leads %d ranges: killing it", l.count(), len(victims))
	if len(victims) == 0 {
		tb.Fatal("r1 leads no range any more: not the scenario measured")
	}
	stopProfile := massProfile(tb)
	killed := time.Now()
	c.stop(c.byID[victim])
	c.waitReledWithin(victims, victim, massReledWithin)
	res := massLoadResult{ranges: n, victims: len(victims), seen: time.Since(killed)}
	res.cpu = stopProfile()
	res.allReled = massBreakdown(tb, p, victims, killed)
	// The load runs on for a while under the new leaders: acknowledgements
	// there are checked too.
	if rest := time.Until(killed.Add(res.seen + after)); rest > 0 {
		time.Sleep(rest)
	}
	l.halt()
	stopped := time.Now()

	res.acks = l.acks(time.Time{}, stopped.Add(time.Hour))
	res.windowAcks = l.acks(killed, stopped.Add(time.Hour))
	for _, rl := range l.ranges {
		res.fails += rl.fails
	}
	// The rate over the stretch before the kill, settling included.
	res.before = float64(l.acks(warm, killed)) / killed.Sub(warm).Seconds()
	res.after = float64(l.acks(killed.Add(res.seen), stopped)) / stopped.Sub(killed.Add(res.seen)).Seconds()
	for _, rl := range l.ranges {
		e, victim := victims[rl.id]
		if !victim {
			continue
		}
		first := time.Duration(-1)
		for _, a := range rl.acks {
			if a.at.After(killed) {
				res.victimAcks++
				// The epoch comparison: an acknowledgement under the
				// killed leader's epoch (one that raced the kill) is
				// not the range appending again.
				if first < 0 && a.epoch > e {
					first = a.at.Sub(killed)
				}
			}
		}
		if first < 0 {
			res.problem("stalled", "victim %s: no append acknowledged under a new epoch after the kill", rl.id)
			first = stopped.Sub(killed)
		}
		res.appending = max(res.appending, first)
	}
	c.checkLoad(l, &res)
	res.promotions = c.failoverPromotions(p, ids, victims, leaders, epochAt, before, victim)
	tb.Logf("mass failover under load: %d ranges, %d victims; all re-led %v (seen %v), all appending %v; acks %d (%d after the kill, %d on victims; %.0f/s before the kill, %.0f/s after all were re-led; %d tries not acknowledged); lost %d, dups %d, unread %d, doubles %d, missing %d, relost %d",
		res.ranges, res.victims, res.allReled, res.seen, res.appending, res.acks, res.windowAcks, res.victimAcks, res.before, res.after, res.fails,
		res.lost, res.dups, res.unread, res.doubles, res.missing, res.relost)
	return res
}

// checkLoad reads every range back from its leader through LogService.Read
// and counts acknowledged records that are missing or hold other bytes
// (lost) and load values written at more than one offset (dups).
func (c *cluster) checkLoad(l *massLoad, res *massLoadResult) {
	c.t.Helper()
	_, leaders := c.leaders()
	urls := map[string]string{}
	for _, tr := range c.replicas {
		if tr.srv != nil {
			urls[tr.id] = tr.srv.URL()
		}
	}
	var mu sync.Mutex
	fanout.Run(len(l.ranges), 8, func(i int) {
		rl := l.ranges[i]
		recs, err := c.readFrom(urls[leaders[rl.id]], rl.id)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			res.unread++
			res.problem("unread", "%s: read from its leader %q: %v (%d acknowledgements unchecked)", rl.id, leaders[rl.id], err, len(rl.acks))
			return
		}
		for _, a := range rl.acks {
			if r, ok := recs[a.offset]; !ok || string(r.GetValue()) != a.value {
				res.lost++
				res.problem("lost", "%s: acknowledged %q at offset %d (epoch %d), the log of %s holds %q there (present %v)",
					rl.id, a.value, a.offset, a.epoch, leaders[rl.id], r.GetValue(), ok)
			}
		}
		seen := map[string]uint64{}
		for off, r := range recs {
			// Only the load's values: a leader's epoch-start records
			// (empty, one per epoch) are not appends.
			if !strings.HasPrefix(string(r.GetValue()), rl.id+"-") {
				continue
			}
			if prev, ok := seen[string(r.GetValue())]; ok {
				res.dups++
				res.problem("dup", "%s: %q written at offsets %d and %d", rl.id, r.GetValue(), prev, off)
			}
			seen[string(r.GetValue())] = off
		}
	})
}

// readFrom reads rangeID's committed records from the replica at url,
// from its log start. A new leader serves reads only once its epoch-start
// record is committed (FailedPrecondition until then), retried for up to
// 10 s; every other error is the answer.
func (c *cluster) readFrom(url, rangeID string) (map[uint64]*tenurev1.Record, error) {
	if url == "" {
		return nil, fmt.Errorf("no live leader")
	}
	rc := c.replicaClient(url)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	st, err := rc.GetStatus(ctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: rangeID}))
	cancel()
	if err != nil || len(st.Msg.GetRanges()) != 1 {
		return nil, fmt.Errorf("status: %v (%d ranges)", err, len(st.Msg.GetRanges()))
	}
	from := st.Msg.GetRanges()[0].GetLogStart()
	lc := c.log_(url)
	out := map[uint64]*tenurev1.Record{}
	notYet := time.Now().Add(10 * time.Second)
	// Bounded: every read that returns records moves from forward, so
	// 100,000 reads are far more than a load of minutes writes.
	for range 100_000 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := lc.Read(ctx, connect.NewRequest(&tenurev1.ReadRequest{RangeId: rangeID, Offset: from}))
		cancel()
		if connect.CodeOf(err) == connect.CodeFailedPrecondition && time.Now().Before(notYet) {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("Read(%d): %w", from, err)
		}
		if len(resp.Msg.GetRecords()) == 0 {
			return out, nil
		}
		for _, r := range resp.Msg.GetRecords() {
			out[r.GetOffset()] = r
			from = r.GetOffset() + 1
		}
	}
	return nil, fmt.Errorf("the read did not end")
}

// failoverPromotions reads the transition records written after a kill
// under load and sorts each promotion by the leader it displaced: the
// killed replica (the failover's own: exactly one per victim range; more
// is a double) or a surviving leader (relost: its lease lapsed or it
// stopped serving, which under load happens when its keep-alives starve,
// a fault of its own that the failover did not cause). The promoter
// writes a record just after its adoption, in the background, so a
// victim still without one is read again, for up to 60 s.
func (c *cluster) failoverPromotions(p *Promoter, ids []string, victims ledAt, leaderAt map[string]string, epochAt ledAt, before map[string]int, killed string) promotions {
	c.t.Helper()
	ctx := context.Background()
	var po promotions
	deadline := time.Now().Add(60 * time.Second)
	for {
		po = promotions{}
		for _, id := range ids {
			n, err := p.countTransitions(ctx, id)
			if err != nil {
				c.t.Fatal(err)
			}
			var trs []*tenurev1.Transition
			if n > before[id] {
				if trs, err = p.transitions(ctx, id, n-before[id]); err != nil {
					c.t.Fatal(err)
				}
			}
			// Oldest first: each record displaced the leader of the one
			// before it, the first the leader at the kill.
			slices.Reverse(trs)
			displaced, failovers, relost := leaderAt[id], 0, 0
			for _, tr := range trs {
				// The epoch comparison: a record at or below the epoch
				// the range had at the kill is from before it (written
				// after the count before, its promotion was done).
				if tr.GetEpoch() <= epochAt[id] {
					continue
				}
				if displaced == killed {
					failovers++
				} else {
					relost++
				}
				displaced = tr.GetLeaderId()
			}
			po.relost += relost
			_, victim := victims[id]
			switch {
			case failovers > 1:
				po.doubles++
			case victim && failovers == 0:
				po.missing++
			case !victim && failovers > 0:
				// Impossible: only a victim was led by the killed one.
				po.moved++
			case relost == 0:
				continue
			default:
				po.relostWhy = append(po.relostWhy, fmt.Sprintf("%s (led by %s at the kill): %d promotions of a surviving leader; records after the kill %v",
					id, leaderAt[id], relost, trs))
				continue
			}
			po.bad = append(po.bad, fmt.Sprintf("%s (victim %v, led by %s at the kill): %d failover promotions, %d of a surviving leader; records after the kill %v",
				id, victim, leaderAt[id], failovers, relost, trs))
		}
		if po.missing == 0 || time.Now().After(deadline) {
			return po
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// countAllTransitions maps each range to how many transition records it
// has, in one etcd read (keys only) rather than one per range.
func (p *Promoter) countAllTransitions(tb testing.TB) map[string]int {
	tb.Helper()
	prefix := p.cfg.Prefix + "transitions/"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := p.cfg.Etcd.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		tb.Fatalf("reading the transition records: %v", err)
	}
	n := map[string]int{}
	for _, kv := range resp.Kvs {
		// transitions/<range>/<epoch>: range ids hold no slash.
		id, _, _ := strings.Cut(strings.TrimPrefix(string(kv.Key), prefix), "/")
		n[id]++
	}
	return n
}
