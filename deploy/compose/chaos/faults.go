package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/tenurelog/tenure/pkg/journal"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// journalEntryBytes is one journal entry: epoch u64, start u64, crc32c u32
// (DESIGN, "The epoch journal").
const journalEntryBytes = 8 + 8 + 4

// killed counts a kill: the replica's next samples are a new incarnation
// (a kill may lose an HWM the store persists lazily).
func (sc *scenario) killed(id string) {
	sc.incarnation[id]++
	sc.obs.restarted(id)
}

// killLeader: docker kill the leader's container; a new leader must be
// promoted; start the killed one again and wait for it to follow.
func (sc *scenario) killLeader(ctx context.Context) error {
	leader, epoch, err := sc.currentLeader(ctx)
	if err != nil {
		return err
	}
	logf("%s: docker kill %s (leader at epoch %d)", sc.name, leader, epoch)
	if _, err := docker(ctx, "kill", sc.stack.ids[leader]); err != nil {
		return err
	}
	sc.faults["kill"]++
	sc.killed(leader)
	if next, err := sc.waitLeader(ctx, epoch, leader); err != nil {
		sc.expect("no new leader after killing %s: %v", leader, err)
	} else {
		logf("%s: %s promoted", sc.name, next)
	}
	time.Sleep(sc.jitter(2 * time.Second))
	logf("%s: docker start %s", sc.name, leader)
	if err := sc.startReplicas(ctx, leader); err != nil {
		return err
	}
	return sc.waitRejoined(ctx, leader)
}

// pauseLeader: docker pause the leader (every process frozen, its sockets
// open) past its lease TTL, then unpause it. Meanwhile a new leader is
// promoted; the unpaused zombie still believes it leads, with appends in
// flight. None of its late acknowledgements may be of a record the new
// epoch lost, and it must step down and follow.
func (sc *scenario) pauseLeader(ctx context.Context) error {
	leader, epoch, err := sc.currentLeader(ctx)
	if err != nil {
		return err
	}
	hold := sc.jitter(3 * sc.cfg.leaseTTL)
	logf("%s: docker pause %s (leader at epoch %d) for at least %v", sc.name, leader, epoch, hold.Round(time.Millisecond))
	if _, err := docker(ctx, "pause", sc.stack.ids[leader]); err != nil {
		return err
	}
	sc.faults["pause"]++
	paused := time.Now()
	next, perr := sc.waitLeader(ctx, epoch, leader)
	if perr != nil {
		sc.expect("no new leader while %s was paused: %v", leader, perr)
	} else {
		logf("%s: %s promoted %v after the pause", sc.name, next, time.Since(paused).Round(time.Millisecond))
	}
	if rest := hold - time.Since(paused); rest > 0 {
		time.Sleep(rest)
	}
	logf("%s: docker unpause %s after %v", sc.name, leader, time.Since(paused).Round(time.Millisecond))
	// Unpaused even when ctx was cancelled: a frozen container would hang
	// the teardown's graceful stop.
	if _, err := docker(context.WithoutCancel(ctx), "unpause", sc.stack.ids[leader]); err != nil {
		return err
	}
	sc.healed = time.Now()
	return sc.waitRejoined(ctx, leader)
}

// disconnectLeader: docker network disconnect the leader from the stack's
// network (peers, promoter, lease service and the workload all lose it),
// past its lease TTL, then connect it again under its aliases.
func (sc *scenario) disconnectLeader(ctx context.Context) error {
	leader, epoch, err := sc.currentLeader(ctx)
	if err != nil {
		return err
	}
	aliases, err := sc.stack.aliases(ctx, leader)
	if err != nil {
		return err
	}
	hold := sc.jitter(3 * sc.cfg.leaseTTL)
	logf("%s: docker network disconnect %s %s (leader at epoch %d) for at least %v", sc.name, sc.stack.network, leader, epoch, hold.Round(time.Millisecond))
	if _, err := docker(ctx, "network", "disconnect", sc.stack.network, sc.stack.ids[leader]); err != nil {
		return err
	}
	sc.faults["disconnect"]++
	cut := time.Now()
	next, perr := sc.waitLeader(ctx, epoch, leader)
	if perr != nil {
		sc.expect("no new leader while %s was disconnected: %v", leader, perr)
	} else {
		logf("%s: %s promoted %v after the disconnect", sc.name, next, time.Since(cut).Round(time.Millisecond))
	}
	if rest := hold - time.Since(cut); rest > 0 {
		time.Sleep(rest)
	}
	args := []string{"network", "connect"}
	for _, a := range aliases {
		args = append(args, "--alias", a)
	}
	args = append(args, sc.stack.network, sc.stack.ids[leader])
	logf("%s: docker network connect %s %s (aliases %v) after %v", sc.name, sc.stack.network, leader, aliases, time.Since(cut).Round(time.Millisecond))
	if _, err := docker(context.WithoutCancel(ctx), args...); err != nil {
		return err
	}
	sc.healed = time.Now()
	if err := sc.stack.refreshPort(ctx, leader, "7100"); err != nil {
		return err
	}
	return sc.waitRejoined(ctx, leader)
}

// restartMajority: stop the leader and one follower together (two of
// three: no quorum is left), keep them down a moment, start both. The range
// is unavailable meanwhile; afterwards it must be promoted again with
// nothing acknowledged lost.
func (sc *scenario) restartMajority(ctx context.Context) error {
	leader, epoch, err := sc.currentLeader(ctx)
	if err != nil {
		return err
	}
	other := sc.follower(leader)
	pair := []string{leader, other}
	logf("%s: docker stop %s (leader at epoch %d) and %s together", sc.name, leader, epoch, other)
	stopErrs := make(chan error, len(pair))
	for _, id := range pair {
		go func() {
			_, err := docker(ctx, "stop", "-t", "10", sc.stack.ids[id])
			stopErrs <- err
		}()
	}
	var errs []error
	for range pair {
		errs = append(errs, <-stopErrs)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	sc.faults["restart"] += len(pair)
	down := sc.jitter(2 * time.Second)
	time.Sleep(down)
	logf("%s: docker start %s and %s after %v down", sc.name, leader, other, down.Round(time.Millisecond))
	if err := sc.startReplicas(ctx, pair...); err != nil {
		return err
	}
	if _, err := sc.waitLeader(ctx, epoch, ""); err != nil {
		sc.expect("no leader above epoch %d after the restart: %v", epoch, err)
	}
	return sc.waitRejoined(ctx, sc.members...)
}

// corruptJournal: stop a follower, corrupt or truncate its journal of the
// range in its volume, start it. Its store must rebuild the journal from the
// records' epochs (its log says so) and the follower must catch up.
func (sc *scenario) corruptJournal(ctx context.Context) error {
	// A planned handover first, so the journal holds two epochs: damage to
	// the first entry is then in the middle (a corrupt journal, refused),
	// not a torn tail that opening merely cuts.
	_, epoch, err := sc.currentLeader(ctx)
	if err != nil {
		return err
	}
	if err := sc.handover(ctx, "", "chaos: a second epoch before damaging a journal"); err != nil {
		return err
	}
	leader, err := sc.waitLeader(ctx, epoch, "")
	if err != nil {
		return err
	}
	f := sc.follower(leader)
	logf("%s: docker stop %s (a follower)", sc.name, f)
	stopped := time.Now()
	if _, err := docker(ctx, "stop", "-t", "10", sc.stack.ids[f]); err != nil {
		return err
	}
	path := "/data/journal/" + sc.rangeID + ".journal"
	mode := []string{"corrupt", "truncate"}[sc.rng.IntN(2)]
	var what string
	err = sc.stack.editFile(ctx, f, path, func(b []byte) ([]byte, error) {
		if len(b) < journal.HeaderBytes+journalEntryBytes {
			return nil, fmt.Errorf("journal %s has %d bytes, no entry to damage", path, len(b))
		}
		switch mode {
		case "corrupt":
			// The first entry's epoch: fails its checksum. The last entry
			// is cut as torn, any other makes the journal corrupt; either
			// way the journal no longer describes the log.
			b[journal.HeaderBytes+7] ^= 0x5a
			what = fmt.Sprintf("flipped bits of the first entry's epoch (%d entries)", (len(b)-journal.HeaderBytes)/journalEntryBytes)
		case "truncate":
			n := len(b)
			b = b[:journal.HeaderBytes+journalEntryBytes/2]
			what = fmt.Sprintf("cut from %d to %d bytes (half an entry after the header)", n, len(b))
		}
		return b, nil
	})
	if err != nil {
		// Started again anyway: the next scenarios need it.
		return errors.Join(err, sc.startReplicas(ctx, f))
	}
	sc.faults["journal-"+mode]++
	logf("%s: %s %s: %s", sc.name, f, path, what)
	logf("%s: docker start %s", sc.name, f)
	if err := sc.startReplicas(ctx, f); err != nil {
		return err
	}
	sc.checkRebuilt(ctx, f, stopped)
	return sc.waitRejoined(ctx, f)
}

// checkRebuilt looks in the replica's log, since it was stopped, for the
// store's "rebuilt the epoch journal" warning for this range.
func (sc *scenario) checkRebuilt(ctx context.Context, id string, since time.Time) {
	err := retry(ctx, 30*time.Second, "the rebuild in "+id+"'s log", func(ctx context.Context) error {
		out, err := dockerLogs(ctx, sc.stack.ids[id], since)
		if err != nil {
			return err
		}
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, "rebuilt the epoch journal") && strings.Contains(line, "range="+sc.rangeID) {
				logf("%s: %s says: %s", sc.name, id, strings.TrimSpace(line))
				return nil
			}
		}
		return errors.New("no rebuild logged yet")
	})
	if err != nil {
		sc.expect("%s did not log rebuilding its journal of %s: %v", id, sc.rangeID, err)
	}
}

// dockerLogs returns a container's stdout and stderr since a time.
func dockerLogs(ctx context.Context, id string, since time.Time) (string, error) {
	// The replica logs to stderr; docker logs replays it on stderr, so
	// the combined output is wanted. docker() keeps stdout only.
	out, err := dockerCombined(ctx, "logs", "--since", since.Add(-time.Second).UTC().Format(time.RFC3339), id)
	if err != nil {
		return "", err
	}
	return out, nil
}

// handover asks the elected promoter for a planned promotion through
// tenurectl promote (the other promoter refuses; either may be elected),
// to replica to when it is not empty.
func (sc *scenario) handover(ctx context.Context, to, reason string) error {
	var errs []error
	for _, p := range []string{"promoter-1", "promoter-2"} {
		args := []string{"--lease", sc.stack.leaseURLs(), "--promoter", sc.stack.url(p, "7200"), "promote", sc.rangeID, "--reason", reason}
		if to != "" {
			args = append(args, "--to", to)
		}
		out, err := runTenurectl(ctx, sc.cfg.tenurectl, args...)
		if err == nil {
			logf("%s: planned handover through %s: %s", sc.name, p, strings.Join(strings.Fields(string(out)), " "))
			return nil
		}
		errs = append(errs, err)
	}
	return fmt.Errorf("planned handover: %w", errors.Join(errs...))
}

// pauseLease: docker pause both lease service containers (every replica
// and promoter loses its lease service; etcd carries on and expires the
// sessions nobody renews) for 1.1-2.5 x the lease TTL, the window in which
// issue 31's wedge was found, then unpause them. Nothing needs to be
// promoted; the range must serve again (the liveness check) with every
// replica following.
func (sc *scenario) pauseLease(ctx context.Context) error {
	leader, epoch, err := sc.currentLeader(ctx)
	if err != nil {
		return err
	}
	var ids []string
	for _, svc := range []string{"lease-1", "lease-2"} {
		if id := sc.stack.ids[svc]; id != "" {
			ids = append(ids, id)
		}
	}
	ttl := sc.cfg.leaseTTL
	hold := ttl*11/10 + time.Duration(sc.rng.Int64N(int64(ttl*14/10)))
	logf("%s: docker pause the lease services for %v (leader %s at epoch %d)", sc.name, hold.Round(time.Millisecond), leader, epoch)
	if _, err := docker(ctx, append([]string{"pause"}, ids...)...); err != nil {
		return err
	}
	sc.faults["lease-pause"]++
	time.Sleep(hold)
	logf("%s: docker unpause the lease services", sc.name)
	// Unpaused even when ctx was cancelled, as pauseLeader does.
	if _, err := docker(context.WithoutCancel(ctx), append([]string{"unpause"}, ids...)...); err != nil {
		return err
	}
	sc.healed = time.Now()
	return sc.waitRejoined(ctx, sc.members...)
}

// Bounds of replace-replica.
const (
	// replaceCatchUp is the learner's catch-up bound (--catch-up-timeout):
	// the spare fetches a few thousand small records.
	replaceCatchUp = 90 * time.Second
	// replaceWithin bounds the whole change, every try of it: the catch-up
	// and three step promotions, each waiting for its epoch-start record.
	replaceWithin = 4 * time.Minute
	dropWait      = 30 * time.Second
)

// replaceReplica: under traffic, `tenurectl range replace-replica` swaps one
// of the range's three members, picked by the seed (the leader a third of
// the time: it hands over first), for the idle spare replica-4: add it as
// a learner, catch it up, promote it to voter, remove the old member, which
// then drops its copy. The range must then have exactly {the two kept,
// replica-4} as voters, with no change in flight; the removed replica must
// no longer host the range, and the spare must follow the leader with the
// log. Convergence, liveness and the final logs are judged over the new
// members; every acknowledged record must be on them.
func (sc *scenario) replaceReplica(ctx context.Context) error {
	leader, epoch, err := sc.currentLeader(ctx)
	if err != nil {
		return err
	}
	gone := sc.members[sc.rng.IntN(len(sc.members))]
	what := "a follower"
	if gone == leader {
		what = "the leader"
	}
	logf("%s: tenurectl range replace-replica %s --remove %s (%s; leader %s at epoch %d) --add %s",
		sc.name, sc.rangeID, gone, what, leader, epoch, spareID)
	sc.faults["replace"]++
	changeErr := sc.replace(ctx, gone)
	// The membership as the lease service has it, whatever the command
	// said: a try whose output was lost may have done the change.
	rng, err := sc.rangeInfo(ctx)
	if err != nil {
		return errors.Join(changeErr, err)
	}
	var voters, learners []string
	for _, m := range rng.GetReplicas() {
		if m.GetLearner() {
			learners = append(learners, m.GetId())
		} else {
			voters = append(voters, m.GetId())
		}
	}
	var want []string
	for _, id := range sc.members {
		if id != gone {
			want = append(want, id)
		}
	}
	want = append(want, spareID)
	slices.Sort(voters)
	if !slices.Equal(voters, want) || len(learners) > 0 || rng.GetChange() != nil {
		inFlight := "none"
		if ch := rng.GetChange(); ch != nil {
			inFlight = fmt.Sprintf("%s %s since epoch %d", ch.GetStep(), ch.GetReplicaId(), ch.GetEpoch())
		}
		sc.expect("after replacing %s with %s the range has voters %v, learners %v, change in flight: %s; want voters %v and no change (%v)",
			gone, spareID, voters, learners, inFlight, want, changeErr)
	}
	if len(voters) > 0 {
		// Judged over whom the range has now, as it says.
		sc.members = voters
	}
	if changeErr != nil {
		return changeErr
	}
	sc.healed = time.Now()
	sc.checkDropped(ctx, gone)
	return sc.waitRejoined(ctx, sc.members...)
}

// replace runs `tenurectl range replace-replica` against the elected
// promoter (the other refuses) until it succeeds, within replaceWithin. A
// try that fails midway leaves its step in flight, and running the same
// command again resumes it (cmd/tenurectl/membership.go).
func (sc *scenario) replace(ctx context.Context, gone string) error {
	ctx, cancel := context.WithTimeout(ctx, replaceWithin)
	defer cancel()
	var last error
	for try := 1; ctx.Err() == nil; try++ {
		for _, p := range []string{"promoter-1", "promoter-2"} {
			start := time.Now()
			out, err := runTenurectlWithin(ctx, replaceWithin, sc.cfg.tenurectl, "--lease", sc.stack.leaseURLs(), "--promoter", sc.stack.url(p, "7200"),
				"--json", "range", "replace-replica", sc.rangeID, "--remove", gone, "--add", spareID+"="+replicaURL(spareID),
				"--catch-up-timeout", replaceCatchUp.String())
			// The phases that arrived, also of a failed try.
			for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				msg := &tenurev1.ChangeReplicasResponse{}
				if line == "" || protojson.Unmarshal([]byte(line), msg) != nil {
					continue
				}
				detail := msg.GetDetail()
				if tr := msg.GetTransition(); tr != nil {
					detail += fmt.Sprintf(" (epoch %d -> %d, committed bound %d, reason %q)", tr.GetPreviousEpoch(), tr.GetEpoch(), tr.GetCommittedBound(), tr.GetReason())
				}
				logf("%s: %s: %s: %s", sc.name, p, msg.GetPhase(), detail)
			}
			if err == nil {
				logf("%s: replace-replica through %s took %v (try %d)", sc.name, p, time.Since(start).Round(time.Millisecond), try)
				return nil
			}
			last = err
			if !strings.Contains(err.Error(), "is not elected") {
				logf("%s: replace-replica through %s, try %d: %v", sc.name, p, try, err)
			}
		}
		// A try can end in error after its last step took effect (its
		// answer lost): running it again is then refused, as the replica
		// to remove is no member any more. The lease service says.
		if rng, err := sc.rangeInfo(ctx); err == nil && rng.GetChange() == nil && member(rng, spareID) == voter && member(rng, gone) == none {
			logf("%s: replace-replica took effect although the command failed: %v", sc.name, last)
			return nil
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	return fmt.Errorf("replace-replica %s with %s did not succeed within %v: %w", gone, spareID, replaceWithin, last)
}

type membership int

const (
	none membership = iota
	learner
	voter
)

// member is how id belongs to the range.
func member(rng *tenurev1.RangeInfo, id string) membership {
	for _, m := range rng.GetReplicas() {
		if m.GetId() == id {
			if m.GetLearner() {
				return learner
			}
			return voter
		}
	}
	return none
}

// rangeInfo reads the range's membership from the lease service.
func (sc *scenario) rangeInfo(ctx context.Context) (*tenurev1.RangeInfo, error) {
	lc := sc.leaseClient()
	var rng *tenurev1.RangeInfo
	err := retry(ctx, 30*time.Second, "the membership of "+sc.rangeID, func(ctx context.Context) error {
		resp, err := lc.GetRange(ctx, connect.NewRequest(&tenurev1.GetRangeRequest{RangeId: sc.rangeID}))
		if err != nil {
			return err
		}
		rng = resp.Msg.GetRange()
		return nil
	})
	return rng, err
}

// checkDropped waits until the removed replica answers that it no longer
// hosts the range: the promoter fenced it and had it drop its copy.
func (sc *scenario) checkDropped(ctx context.Context, id string) {
	c := sc.replicas[id]
	err := retry(ctx, dropWait, id+" dropping "+sc.rangeID, func(ctx context.Context) error {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		resp, err := c.GetStatus(cctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: sc.rangeID}))
		if connect.CodeOf(err) == connect.CodeNotFound {
			return nil
		}
		if err != nil {
			return err
		}
		for _, r := range resp.Msg.GetRanges() {
			if r.GetRangeId() == sc.rangeID {
				return fmt.Errorf("%s still hosts the range: %s at epoch %d (fenced %d), log end %d", id, roleOf(r), r.GetEpoch(), r.GetFencedEpoch(), r.GetLogEnd())
			}
		}
		if lost := resp.Msg.GetLostRanges(); len(lost) > 0 {
			return fmt.Errorf("%s reports the range lost (%v), not dropped", id, lost)
		}
		return nil
	})
	if err != nil {
		sc.expect("the removed replica did not drop the range: %v", err)
		return
	}
	logf("%s: %s no longer hosts the range", sc.name, id)
}
