package promoter

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// Failover benchmarks. Each runs a fixed number of rounds on one in-process
// cluster (b.N is not used: a round kills and restarts real servers) and
// reports medians and maxima:
//
//	go test -run '^$' -bench 'Failover|Planned' -benchtime 1x ./services/promoter
const failoverRounds = 20

// BenchmarkFailover: leader process killed (its server drops every
// connection, its lease session is abandoned) to the first append
// acknowledged under the new epoch; and the promotion's own time, decision
// to adoption, from the transition record.
func BenchmarkFailover(b *testing.B) {
	c := newCluster(b, 3)
	c.createRange("r", "r1")
	p := c.newPromoter("p1", true)
	var failover, promotion []time.Duration
	for round := range failoverRounds {
		leader, epoch := c.leader("r", 1, 20*time.Second)
		if _, err := c.appendOne("r", fmt.Sprintf("before-%d", round), 10*time.Second); err != nil {
			b.Fatal(err)
		}
		killed := time.Now()
		c.stop(c.byID[leader])
		newEpoch := c.appendUnder("r", epoch, 20*time.Second)
		failover = append(failover, time.Since(killed))
		trs, err := p.transitions(context.Background(), "r", 1)
		if err != nil || len(trs) != 1 || trs[0].GetEpoch() != newEpoch {
			waitFor(b, "the transition record", 10*time.Second, func() bool {
				trs, err = p.transitions(context.Background(), "r", 1)
				return err == nil && len(trs) == 1 && trs[0].GetEpoch() == newEpoch
			})
		}
		promotion = append(promotion, time.Duration(trs[0].GetDurationUs())*time.Microsecond)
		c.start(c.byID[leader])
		waitFor(b, "the restarted replica to follow", 20*time.Second, func() bool {
			st := c.status(leader, "r")
			return st.GetRole() == tenurev1.Role_ROLE_FOLLOWER && st.GetEpoch() == newEpoch
		})
	}
	report(b, "failover", failover)
	report(b, "promotion", promotion)
}

// BenchmarkPlannedPromote: the longest time appends go unanswered around a
// planned handover (Promote --to, each round to the next replica: the first
// re-promotes the leader r1, every later one moves leadership), with one
// append in flight at a time. unanswered-p50-ms is the planned-handover gap
// (issue 27's target: median under 100 ms).
func BenchmarkPlannedPromote(b *testing.B) {
	c := newCluster(b, 3)
	c.createRange("r", "r1")
	p := c.newPromoter("p1", true)
	waitFor(b, "the promoter to be elected", 10*time.Second, p.Elected)
	var gaps []time.Duration
	for round := range failoverRounds {
		c.leader("r", 1, 20*time.Second)
		stop := make(chan struct{})
		done := make(chan time.Duration)
		go func() {
			var worst time.Duration
			last := time.Now()
			for i := 0; ; i++ {
				select {
				case <-stop:
					done <- worst
					return
				default:
				}
				if _, err := c.appendOne("r", fmt.Sprintf("r%d-%d", round, i), 10*time.Second); err == nil {
					worst = max(worst, time.Since(last))
					last = time.Now()
				}
			}
		}()
		time.Sleep(100 * time.Millisecond)
		preferred := fmt.Sprintf("r%d", round%3+1)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := handler{p}.Promote(ctx, connect.NewRequest(&tenurev1.PromoteRequest{RangeId: "r", PreferredReplicaId: preferred, Reason: "planned", Force: true}))
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		// A handover's gap only counts if it landed where it was asked.
		if got := resp.Msg.GetTransition().GetLeaderId(); got != preferred {
			b.Fatalf("round %d: Promote(to %s) made %s the leader", round, preferred, got)
		}
		time.Sleep(100 * time.Millisecond)
		close(stop)
		gaps = append(gaps, <-done)
	}
	report(b, "unanswered", gaps)
}

// BenchmarkMassFailover: a replica leading many ranges is killed; the time
// until every one of its ranges has a new leader. Two shapes, each on a
// cluster of its own:
//
//   - loaded-third, issue 29's: 1,000 ranges, leaders spread evenly (the
//     victim leads 334), one producer per range with one append in flight
//     on all of them throughout (mass_load_test.go), the load kept running
//     1 s after every victim is re-led; then every acknowledged record is
//     read back from its range's leader. Targets: all-re-led-ms under
//     2000, lost 0, doubles 0.
//   - idle-all: 1,000 idle ranges all led by the victim (leadAll moves
//     them there first and the benchmark refuses to report otherwise).
//
// all-re-led-ms is the kill to the end of the last victim's adoption step,
// from the transition records; seen-re-led-ms is when the test's poll
// (every 200ms, so up to that much late) saw every victim led at a new
// epoch by a survivor, the check that the records are not lying. cpu-ms is
// the whole process's CPU from the kill to that poll. Under load also:
// appending-ms, the kill to the last victim range's first append
// acknowledged under its new epoch (the producers' view); acks, every
// acknowledged append, window-acks those after the kill, victim-acks those
// on victim ranges after the kill; lost, acknowledged records missing or
// different at their offset; dups, a value written twice (the producers are
// idempotent); doubles, ranges the failover promoted more than once (more
// than one promotion after the kill displacing the killed replica);
// relost, promotions after the kill that displaced a surviving leader (its
// lease lapsed under the load: not the failover's doing, but a range
// promoted again all the same, so reported).
//
// Each run is one failover (b.N is not used; -benchtime=1x). The issue's
// figure is the median of five runs, each on a fresh cluster, as five
// invocations:
//
//	for i in 1 2 3 4 5; do go test -run '^$' -bench 'MassFailover/loaded' -benchtime 1x ./services/promoter; done
//
// (-count 5 runs the five in one process, but the first run that fails
// ends the rest.) The median is the third of the five all-re-led-ms values
// sorted; a run reporting lost, dups or doubles above 0 fails.
func BenchmarkMassFailover(b *testing.B) {
	const ranges = 1000
	b.Run("loaded-third", func(b *testing.B) {
		res := massFailoverUnderLoad(b, ranges, time.Second)
		b.ReportMetric(float64(res.victims), "victims")
		b.ReportMetric(float64(res.allReled.Milliseconds()), "all-re-led-ms")
		b.ReportMetric(float64(res.seen.Milliseconds()), "seen-re-led-ms")
		b.ReportMetric(float64(res.appending.Milliseconds()), "appending-ms")
		b.ReportMetric(float64(res.cpu.Milliseconds()), "cpu-ms")
		b.ReportMetric(float64(res.acks), "acks")
		b.ReportMetric(float64(res.windowAcks), "window-acks")
		b.ReportMetric(float64(res.victimAcks), "victim-acks")
		b.ReportMetric(float64(res.lost), "lost")
		b.ReportMetric(float64(res.dups), "dups")
		b.ReportMetric(float64(res.doubles), "doubles")
		b.ReportMetric(float64(res.relost), "relost")
		b.ReportMetric(res.before, "acks/s-before")
		b.ReportMetric(res.after, "acks/s-after")
		// Measured, but not a failover to quote: say so.
		res.logProblems(b)
		if res.unread > 0 {
			b.Errorf("%d ranges could not be read back: their acknowledgements are unchecked", res.unread)
		}
		if len(res.bad) > 0 {
			b.Errorf("transition records: %d doubles, %d victims never promoted, %d others displacing the killed leader: %v",
				res.doubles, res.missing, res.moved, res.bad[:min(len(res.bad), 10)])
		}
		if res.relost > 0 {
			b.Logf("%d promotions displaced a surviving leader (its lease lapsed under load), e.g. %v", res.relost, res.relostWhy[:min(len(res.relostWhy), 3)])
		}
	})
	b.Run("idle-all", func(b *testing.B) {
		c := newClusterWait(b, 3, time.Second)
		for i := range ranges {
			c.createRange(fmt.Sprintf("m%04d", i), "r1")
		}
		p := c.newPromoter("p1", true, func(cfg *Config) { cfg.FenceTimeout, cfg.RPCTimeout = 10*time.Second, 10*time.Second })
		ids := make([]string, ranges)
		for i := range ids {
			ids[i] = fmt.Sprintf("m%04d", i)
		}
		// Move every range under the replica already leading the most,
		// then settle again (every record written, every follower caught
		// up).
		victim := c.mostLeading(ids)
		c.leadAll(p, ids, victim)
		victim, victims, _ := c.settle(p, ids)
		if len(victims) != ranges {
			b.Fatalf("the replica to kill (%s) leads %d of %d ranges: not the scenario measured", victim, len(victims), ranges)
		}
		stopProfile := massProfile(b)
		killed := time.Now()
		c.stop(c.byID[victim])
		c.waitReled(victims, victim)
		seen := time.Since(killed)
		b.ReportMetric(float64(stopProfile().Milliseconds()), "cpu-ms")
		b.ReportMetric(float64(len(victims)), "ranges")
		b.ReportMetric(float64(seen.Milliseconds()), "seen-re-led-ms")
		b.ReportMetric(float64(massBreakdown(b, p, victims, killed).Milliseconds()), "all-re-led-ms")
	})
}

// appendUnder appends until an append is acknowledged under an epoch above
// epoch, and returns that epoch.
func (c *cluster) appendUnder(rangeID string, epoch uint64, within time.Duration) uint64 {
	c.t.Helper()
	deadline := time.Now().Add(within)
	for i := 0; time.Now().Before(deadline); i++ {
		for _, tr := range c.replicas {
			if tr.srv == nil {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			resp, err := c.log_(tr.srv.URL()).Append(ctx, connect.NewRequest(&tenurev1.AppendRequest{RangeId: rangeID, Records: [][]byte{[]byte(fmt.Sprintf("probe-%d", i))}}))
			cancel()
			if err == nil && resp.Msg.GetEpoch() > epoch {
				return resp.Msg.GetEpoch()
			}
		}
		time.Sleep(time.Millisecond)
	}
	c.t.Fatalf("no append acknowledged under an epoch above %d within %v", epoch, within)
	return 0
}

func report(b *testing.B, name string, ds []time.Duration) {
	slices.Sort(ds)
	med := ds[len(ds)/2]
	if len(ds)%2 == 0 {
		med = (ds[len(ds)/2-1] + ds[len(ds)/2]) / 2
	}
	b.ReportMetric(float64(med.Microseconds())/1000, name+"-p50-ms")
	b.ReportMetric(float64(ds[len(ds)-1].Microseconds())/1000, name+"-max-ms")
	b.Logf("%s over %d rounds: median %v, max %v, all %v", name, len(ds), med, ds[len(ds)-1], ds)
}
