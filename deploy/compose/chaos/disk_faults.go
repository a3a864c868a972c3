package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// diskFullReplica is the replica whose /data is a small tmpfs of the host's
// in the disk-full scenario (chaos.sh mounts it and passes --disk-full-dir;
// docker-compose.diskfull.yml binds it and sets a small reserve).
const diskFullReplica = "replica-3"

// fillerName is the file the scenario writes into the replica's data
// directory to take its free space, as any other program sharing the disk
// would. The replica never reads or lists it.
const fillerName = "chaos-disk-filler"

// Bounds of the disk-full scenario's waits.
const (
	diskStateWait = 30 * time.Second // the replica noticing free space fall or come back
	diskFullHold  = 3 * time.Second  // how long the disk stays full, at least
)

// diskFull: take the free space of one member's filesystem (a tmpfs of a
// fixed size) down below its reserve, under traffic. The replica must say
// so (GetStatus: disk full with the reason), refuse appends with
// ResourceExhausted if it leads, lag if it follows, keep answering status
// and reads, lose nothing it acknowledged; once the space is given back it
// must resume by itself, without a restart, and catch up.
func (sc *scenario) diskFull(ctx context.Context) error {
	dir := sc.cfg.diskFullDir
	if dir == "" {
		return errors.New("disk-full needs --disk-full-dir: the host directory that is " + diskFullReplica + "'s /data (chaos.sh mounts a tmpfs there as root)")
	}
	id := diskFullReplica
	c := sc.replicas[id]
	st, err := replicaDisk(ctx, c)
	if err != nil {
		return fmt.Errorf("%s: disk status: %w", id, err)
	}
	if st.GetReserveBytes() == 0 {
		return fmt.Errorf("%s has no disk reserve: run with deploy/compose/docker-compose.diskfull.yml", id)
	}
	leader, epoch, err := sc.currentLeader(ctx)
	if err != nil {
		return err
	}
	// Half the seeds fill the leader's disk: a planned handover to the
	// replica first (the other half fill a follower's, or the leader's
	// when it already leads).
	if leader != id && sc.rng.IntN(2) == 0 {
		if err := sc.handover(ctx, id, "chaos: lead from the replica whose disk fills"); err != nil {
			return err
		}
		if leader, err = sc.waitLeader(ctx, epoch, ""); err != nil {
			return err
		}
		if leader != id {
			return fmt.Errorf("handover to %s: %s leads", id, leader)
		}
		epoch = sc.statuses(ctx)[id].GetEpoch()
	}
	role := "a follower"
	if leader == id {
		role = "the leader"
	}
	// Leave half the reserve free: below the reserve, so appends stop,
	// above zero, so the fences and the indexing the reserve is for still
	// have room.
	fill := int64(st.GetFreeBytes()) - int64(st.GetReserveBytes())/2
	if fill <= 0 {
		return fmt.Errorf("%s: only %d bytes free with a reserve of %d before the fault: the volume is too small for the scenario", id, st.GetFreeBytes(), st.GetReserveBytes())
	}
	filler := filepath.Join(dir, fillerName)
	logf("%s: filling %s's disk (%s, leader %s at epoch %d): %d of %d free bytes taken, reserve %d",
		sc.name, id, role, leader, epoch, fill, st.GetFreeBytes(), st.GetReserveBytes())
	if err := writeFiller(filler, fill); err != nil {
		_ = os.Remove(filler)
		return err
	}
	sc.faults["disk-full"]++
	full, err := sc.waitDisk(ctx, id, true)
	if err != nil {
		sc.expect("%s never reported its disk full: %v", id, err)
	} else {
		logf("%s: %s reports disk full: %s", sc.name, id, full.GetReason())
		if leader == id {
			sc.expectAppendRefused(ctx, id)
		}
	}
	time.Sleep(sc.jitter(diskFullHold))
	logf("%s: removing the filler from %s's disk", sc.name, id)
	if err := os.Remove(filler); err != nil {
		return fmt.Errorf("remove %s: %w", filler, err)
	}
	sc.healed = time.Now()
	if _, err := sc.waitDisk(ctx, id, false); err != nil {
		sc.expect("%s did not resume after its disk had room again: %v", id, err)
	} else {
		logf("%s: %s resumed %v after the space came back", sc.name, id, time.Since(sc.healed).Round(time.Millisecond))
	}
	return sc.waitRejoined(ctx, id)
}

// replicaDisk is a replica's view of its data directory's filesystem.
func replicaDisk(ctx context.Context, c interface {
	GetStatus(context.Context, *connect.Request[tenurev1.ReplicaServiceGetStatusRequest]) (*connect.Response[tenurev1.ReplicaServiceGetStatusResponse], error)
}) (*tenurev1.DiskStatus, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	res, err := c.GetStatus(cctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{}))
	if err != nil {
		return nil, err
	}
	if res.Msg.GetDisk() == nil {
		return nil, errors.New("the status has no disk part (a replica older than disk status)")
	}
	return res.Msg.GetDisk(), nil
}

// waitDisk waits until replica id reports its disk full (or not).
func (sc *scenario) waitDisk(ctx context.Context, id string, full bool) (*tenurev1.DiskStatus, error) {
	var last *tenurev1.DiskStatus
	err := retry(ctx, diskStateWait, fmt.Sprintf("%s reporting disk full=%t", id, full), func(ctx context.Context) error {
		st, err := replicaDisk(ctx, sc.replicas[id])
		if err != nil {
			return err
		}
		last = st
		if st.GetFull() != full {
			return fmt.Errorf("disk full=%t (%d bytes free, reserve %d, %q)", st.GetFull(), st.GetFreeBytes(), st.GetReserveBytes(), st.GetReason())
		}
		return nil
	})
	return last, err
}

// expectAppendRefused appends one record to the full leader itself: it
// must answer ResourceExhausted (a refusal the client can act on), not
// accept a record it may not be able to store, nor fail otherwise.
func (sc *scenario) expectAppendRefused(ctx context.Context, id string) {
	lc := newLogClient(sc.stack, id)
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := lc.Append(cctx, connect.NewRequest(&tenurev1.AppendRequest{RangeId: sc.rangeID, Records: [][]byte{[]byte("disk-full-probe")}}))
	switch code := connect.CodeOf(err); {
	case err == nil:
		sc.expect("the full leader %s acknowledged an append", id)
	case code == connect.CodeResourceExhausted:
		logf("%s: the full leader refused an append: %v", sc.name, err)
	default:
		// Not-leader (it was deposed meanwhile) is no refusal for want of
		// space, but no failure of the rule either: say it.
		logf("%s: the append to %s failed with %v, not resource_exhausted (still leading?)", sc.name, id, err)
		if code != connect.CodeFailedPrecondition && code != connect.CodeUnavailable {
			sc.expect("the full leader %s answered an append with %v, want resource_exhausted", id, err)
		}
	}
}

// writeFiller writes n bytes to path and syncs them: on a tmpfs the blocks
// are taken as they are written, so the replica sees the space gone once
// this returns.
func writeFiller(path string, n int64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	for left := n; left > 0; {
		k := min(left, int64(len(buf)))
		if _, err := f.Write(buf[:k]); err != nil {
			f.Close()
			return fmt.Errorf("write filler %s: %w", path, err)
		}
		left -= k
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
