package logstore_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

func TestSetStateIsDurableAndFenceNeverDecreases(t *testing.T) {
	o := newOpener(t)
	s := o.open()
	r := mustRange(t, s, "r1")
	if st := r.State(); st.FencedEpoch != 0 || st.Role != tenurev1.Role_ROLE_UNSPECIFIED {
		t.Fatalf("State() of a new range = %+v, want zero", st)
	}
	want := logstore.State{
		FencedEpoch: 7, Epoch: 6, Role: tenurev1.Role_ROLE_FOLLOWER,
		LeaderID: "n2", LeaderAddress: "http://127.0.0.1:7102",
		Replicas: []*tenurev1.Replica{{Id: "n1", Address: "http://127.0.0.1:7101"}, {Id: "n2", Address: "http://127.0.0.1:7102"}},
	}
	if err := r.SetState(want); err != nil {
		t.Fatalf("SetState = %v", err)
	}
	// State returns a copy: changing it changes nothing stored.
	got := r.State()
	got.Replicas[0].Id = "mutated"
	if r.State().Replicas[0].GetId() != "n1" {
		t.Fatal("State() shares Replicas with the range")
	}

	if err := r.SetState(logstore.State{FencedEpoch: 6, Epoch: 6}); !errors.Is(err, logstore.ErrStaleEpoch) {
		t.Errorf("SetState lowering the fence 7 -> 6 = %v, want ErrStaleEpoch", err)
	}
	if err := r.SetState(logstore.State{FencedEpoch: 8, Epoch: 9}); !errors.Is(err, logstore.ErrInvalid) {
		t.Errorf("SetState with Epoch > FencedEpoch = %v, want ErrInvalid", err)
	}
	if err := r.SetState(logstore.State{FencedEpoch: 8, Role: tenurev1.Role(42)}); !errors.Is(err, logstore.ErrInvalid) {
		t.Errorf("SetState with an unknown role = %v, want ErrInvalid", err)
	}
	closeStore(t, s)

	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("r1")
	got = r.State()
	if got.FencedEpoch != 7 || got.Epoch != 6 || got.Role != want.Role || got.LeaderID != "n2" || got.LeaderAddress != want.LeaderAddress || len(got.Replicas) != 2 ||
		got.Replicas[1].GetId() != "n2" || got.Replicas[1].GetAddress() != "http://127.0.0.1:7102" {
		t.Fatalf("State() after reopen = %+v, want %+v", got, want)
	}
	if err := r.SetState(logstore.State{FencedEpoch: 3}); !errors.Is(err, logstore.ErrStaleEpoch) {
		t.Fatalf("SetState lowering the fence after reopen = %v, want ErrStaleEpoch", err)
	}
}

func TestCreateRange(t *testing.T) {
	o := newOpener(t)
	s := o.open()
	r1 := mustRange(t, s, "r1")
	if again := mustRange(t, s, "r1"); again != r1 {
		t.Fatal("CreateRange twice returned another Range")
	}
	for _, bad := range []string{"", "a/b", ".hidden", "x y"} {
		if _, err := s.CreateRange(bad); !errors.Is(err, logstore.ErrInvalid) {
			t.Errorf("CreateRange(%q) = %v, want ErrInvalid", bad, err)
		}
	}
	closeStore(t, s)
	s = o.open()
	defer closeStore(t, s)
	// A created range persists even with nothing in it.
	if ids := s.RangeIDs(); len(ids) != 1 || ids[0] != "r1" {
		t.Fatalf("RangeIDs() after reopen = %v, want [r1]", ids)
	}
	r, _ := s.Range("r1")
	if r.LogEnd() != 0 || len(r.History()) != 0 {
		t.Fatalf("empty range after reopen: LogEnd %d, History %v", r.LogEnd(), r.History())
	}
}

func TestHWM(t *testing.T) {
	o := newOpener(t)
	s := o.open()
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	appendN(t, r, 1, 9)

	if err := r.SetHWM(11); !errors.Is(err, logstore.ErrOutOfRange) {
		t.Fatalf("SetHWM(11) above LogEnd 10 = %v, want ErrOutOfRange", err)
	}
	if err := r.SetHWM(6); err != nil {
		t.Fatal(err)
	}
	if err := r.SetHWM(4); err != nil || r.HWM() != 6 {
		t.Fatalf("SetHWM(4) after 6 = %v, HWM %d; want ignored, 6", err, r.HWM())
	}

	// The HWM rides a commit without a sync of its own.
	waitDurable(t, r, 10) // quiesce the committer
	before := s.Stats()
	if err := r.SetHWM(8); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.Stats().Commits == before.Commits {
		if time.Now().After(deadline) {
			t.Fatal("the HWM was never committed")
		}
		time.Sleep(time.Millisecond)
	}
	if after := s.Stats(); after.Syncs != before.Syncs {
		t.Errorf("persisting the HWM alone took %d syncs, want 0", after.Syncs-before.Syncs)
	}
	// The next group commit's sync covers it.
	base := appendN(t, r, 1, 1)
	waitDurable(t, r, base+1)
	closeStore(t, s)

	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("r1")
	if r.HWM() != 8 {
		t.Fatalf("HWM() after reopen = %d, want 8", r.HWM())
	}
}

// waitChanged waits, bounded, for ch to close.
func waitChanged(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("Changed() not closed by %s", what)
	}
}

func TestChangedWakesWaiters(t *testing.T) {
	s := newOpener(t).open()
	defer closeStore(t, s)
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	waitDurable(t, r, 1)

	ch := r.Changed()
	base := appendN(t, r, 1, 1)
	waitChanged(t, ch, "Append") // LogEnd moved before Append returned

	// Durability follows the write; wake on each change until it shows.
	for r.DurableEnd() < base+1 {
		ch := r.Changed()
		if r.DurableEnd() >= base+1 {
			break
		}
		waitChanged(t, ch, "the group commit's sync")
	}

	ch = r.Changed()
	if err := r.SetHWM(2); err != nil {
		t.Fatal(err)
	}
	waitChanged(t, ch, "SetHWM")

	ch = r.Changed()
	if err := r.SetState(logstore.State{FencedEpoch: 1, Epoch: 1, Role: tenurev1.Role_ROLE_LEADER}); err != nil {
		t.Fatal(err)
	}
	waitChanged(t, ch, "SetState")

	// Many waiters on one channel all wake (broadcast).
	ch = r.Changed()
	woke := make(chan struct{}, 8)
	for range 8 {
		go func() { <-ch; woke <- struct{}{} }()
	}
	appendN(t, r, 1, 1)
	for range 8 {
		waitChanged(t, woke, "a broadcast")
	}
}

func TestClose(t *testing.T) {
	s := newOpener(t).open()
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	ch := r.Changed()
	closeStore(t, s)
	waitChanged(t, ch, "Close")
	if _, err := r.Append(1, false, [][]byte{[]byte("x")}); !errors.Is(err, logstore.ErrClosed) {
		t.Errorf("Append after Close = %v, want ErrClosed", err)
	}
	if _, err := r.Read(0, 1, 0); !errors.Is(err, logstore.ErrClosed) {
		t.Errorf("Read after Close = %v, want ErrClosed", err)
	}
	if err := s.Close(); !errors.Is(err, logstore.ErrClosed) {
		t.Errorf("second Close = %v, want ErrClosed", err)
	}
}

func TestFenceStopsLowerEpochAppends(t *testing.T) {
	s := newOpener(t).open()
	defer closeStore(t, s)
	r := mustRange(t, s, "r1")
	if err := r.SetState(logstore.State{FencedEpoch: 1, Epoch: 1, Role: tenurev1.Role_ROLE_LEADER}); err != nil {
		t.Fatal(err)
	}
	lead(t, r, 1)

	// Appends racing the fence: each is either in the log by the time
	// SetState returns, or refused.
	var accepted sync.Map
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				base, err := r.Append(1, false, [][]byte{[]byte("x")})
				if err != nil {
					if !errors.Is(err, logstore.ErrStaleEpoch) {
						t.Errorf("Append racing the fence = %v, want nil or ErrStaleEpoch", err)
					}
					return
				}
				accepted.Store(base, true)
			}
		})
	}
	time.Sleep(5 * time.Millisecond)
	if err := r.SetState(logstore.State{FencedEpoch: 2, Role: tenurev1.Role_ROLE_FENCED}); err != nil {
		t.Fatal(err)
	}
	end, durable := r.LogEnd(), r.DurableEnd()
	close(stop)
	wg.Wait()
	if durable != end {
		t.Fatalf("after the fence: DurableEnd %d, LogEnd %d; want everything accepted synced", durable, end)
	}
	if r.LogEnd() != end {
		t.Fatalf("the log grew from %d to %d after the fence returned", end, r.LogEnd())
	}
	accepted.Range(func(k, _ any) bool {
		if k.(uint64) >= end {
			t.Errorf("an append at %d was accepted but is not below the fenced log end %d", k, end)
		}
		return true
	})
	if _, err := r.Append(1, false, [][]byte{[]byte("x")}); !errors.Is(err, logstore.ErrStaleEpoch) {
		t.Fatalf("Append(1) after the fence at 2 = %v, want ErrStaleEpoch", err)
	}
	if err := r.RecordEpoch(1, r.LogEnd()); !errors.Is(err, logstore.ErrStaleEpoch) {
		t.Fatalf("RecordEpoch(1) after the fence at 2 = %v, want ErrStaleEpoch", err)
	}
}
