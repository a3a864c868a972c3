package logstore_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/tenurelog/tenure/services/replica/logstore"
)

func produce(t testing.TB, r *logstore.Range, epoch uint64, pa logstore.ProducerAppend, vals ...string) (uint64, bool, error) {
	t.Helper()
	var vs [][]byte
	for _, v := range vals {
		vs = append(vs, []byte(v))
	}
	return r.AppendProduced(epoch, pa, vs)
}

// TestAppendProducedRules: each (producer, sequence) is written once; a
// retry answers the original offset; a gap names the expected sequence; an
// older producer epoch is refused; non-idempotent appends interleave freely.
func TestAppendProducedRules(t *testing.T) {
	s := newOpener(t).open()
	defer closeStore(t, s)
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	p := logstore.ProducerID{7}
	pa := func(epoch uint32, seq uint64) logstore.ProducerAppend {
		return logstore.ProducerAppend{ID: p, Epoch: epoch, FirstSeq: seq}
	}

	base, dup, err := produce(t, r, 1, pa(0, 0), "a", "b")
	if err != nil || dup || base != 1 {
		t.Fatalf("first append = %d, %v, %v; want 1, false, nil", base, dup, err)
	}
	appendN(t, r, 1, 3) // another writer's records between
	if base, dup, err = produce(t, r, 1, pa(0, 2), "c"); err != nil || dup || base != 6 {
		t.Fatalf("next sequence = %d, %v, %v; want 6, false, nil", base, dup, err)
	}
	for _, tc := range []struct {
		seq  uint64
		vals []string
		base uint64
	}{{0, []string{"a", "b"}, 1}, {1, []string{"b"}, 2}, {2, []string{"c"}, 6}} {
		if base, dup, err := produce(t, r, 1, pa(0, tc.seq), tc.vals...); err != nil || !dup || base != tc.base {
			t.Errorf("retry of sequence %d = %d, %v, %v; want %d, true, nil", tc.seq, base, dup, err, tc.base)
		}
	}
	end := r.LogEnd()
	for _, tc := range []struct {
		name string
		a    logstore.ProducerAppend
		n    int
		want error
		msg  string
	}{
		{"gap", pa(0, 5), 1, logstore.ErrSequence, "expected sequence 3"},
		{"overlap", pa(0, 1), 2, logstore.ErrSequence, "expected sequence 3"},
		{"new epoch not at 0", pa(1, 3), 1, logstore.ErrSequence, "expected sequence 0"},
		{"unknown producer not at 0", logstore.ProducerAppend{ID: logstore.ProducerID{8}, FirstSeq: 4}, 1, logstore.ErrProducerWindow, "sequence 0"},
	} {
		vals := make([]string, tc.n)
		if _, _, err := produce(t, r, 1, tc.a, vals...); !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: AppendProduced(%+v) = %v, want %v naming %q", tc.name, tc.a, err, tc.want, tc.msg)
		}
	}
	if r.LogEnd() != end {
		t.Fatalf("refused appends wrote: log end %d, want %d", r.LogEnd(), end)
	}
	// A new instance at epoch 1 fences epoch 0.
	if _, dup, err := produce(t, r, 1, pa(1, 0), "d"); err != nil || dup {
		t.Fatalf("new producer epoch = %v, %v", dup, err)
	}
	if _, _, err := produce(t, r, 1, pa(0, 3), "e"); !errors.Is(err, logstore.ErrProducerFenced) {
		t.Fatalf("older producer epoch = %v, want ErrProducerFenced", err)
	}
	recs := readAll(t, r)
	last := recs[len(recs)-1]
	if string(last.GetValue()) != "d" || string(last.GetProducerId()) != string(p[:]) || last.GetProducerEpoch() != 1 || last.GetProducerSequence() != 0 {
		t.Fatalf("last record = %v, want value d from producer %x epoch 1 sequence 0", last, p)
	}
}

// TestDedupeStateComesFromTheLog: a follower that copied the records, the
// same store reopened, and a log truncated below a batch all decide a retry
// from the records they hold.
func TestDedupeStateComesFromTheLog(t *testing.T) {
	o := newOpener(t)
	s := o.open()
	leader := mustRange(t, s, "a")
	lead(t, leader, 1)
	p := logstore.ProducerAppend{ID: logstore.ProducerID{9}}
	if _, _, err := produce(t, leader, 1, p, "x", "y"); err != nil {
		t.Fatal(err)
	}
	p.FirstSeq = 2
	if _, _, err := produce(t, leader, 1, p, "z"); err != nil {
		t.Fatal(err)
	}
	// The follower writes what it fetched, producer fields included.
	follower := mustRange(t, s, "b")
	if err := follower.AppendRecords(readAll(t, leader)); err != nil {
		t.Fatalf("AppendRecords = %v", err)
	}
	lead(t, follower, 2)
	retry := logstore.ProducerAppend{ID: p.ID, FirstSeq: 2}
	if base, dup, err := produce(t, follower, 2, retry, "z"); err != nil || !dup || base != 3 {
		t.Fatalf("retry on the promoted follower = %d, %v, %v; want 3, true, nil", base, dup, err)
	}
	waitDurable(t, follower, follower.LogEnd())
	closeStore(t, s)

	s = o.open()
	defer closeStore(t, s)
	follower, _ = s.Range("b")
	if base, dup, err := produce(t, follower, 2, retry, "z"); err != nil || !dup || base != 3 {
		t.Fatalf("retry after reopen = %d, %v, %v; want 3, true, nil", base, dup, err)
	}
	// Cut the last batch (and the epoch-start record after it): the retry
	// is then new, and written again.
	if _, err := follower.Truncate(3); err != nil {
		t.Fatalf("Truncate(3) = %v", err)
	}
	lead(t, follower, 3)
	if base, dup, err := produce(t, follower, 3, retry, "z"); err != nil || dup || base != 4 {
		t.Fatalf("retry after the cut = %d, %v, %v; want 4, false, nil", base, dup, err)
	}
}

// TestDedupeStateBuildsUnderConcurrentAppends: after a reopen the first
// idempotent appends build the table from the log while other appends keep
// moving the log end; every retry still finds its original offset, and
// every new append is written once.
func TestDedupeStateBuildsUnderConcurrentAppends(t *testing.T) {
	o := newOpener(t)
	s := o.open()
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	const producers = 4
	last := make([]uint64, producers) // base of each producer's last batch
	for round := range 50 {
		for p := range producers {
			pa := logstore.ProducerAppend{ID: logstore.ProducerID{byte(p + 1)}, FirstSeq: uint64(round)}
			base, _, err := produce(t, r, 1, pa, "v")
			if err != nil {
				t.Fatal(err)
			}
			last[p] = base
		}
		appendN(t, r, 1, 20)
	}
	waitDurable(t, r, r.LogEnd())
	closeStore(t, s)

	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("r1")
	stop := make(chan struct{})
	plain := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				plain <- nil
				return
			default:
			}
			if _, err := r.Append(1, false, [][]byte{[]byte("plain")}); err != nil {
				plain <- err
				return
			}
		}
	}()
	errs := make(chan error, producers)
	parallel(producers, func(p int) {
		id := logstore.ProducerID{byte(p + 1)}
		base, dup, err := produce(t, r, 1, logstore.ProducerAppend{ID: id, FirstSeq: 49}, "v")
		if err != nil || !dup || base != last[p] {
			errs <- fmt.Errorf("producer %d: retry after reopen = %d, %v, %v; want %d, true, nil", p, base, dup, err, last[p])
			return
		}
		if _, dup, err := produce(t, r, 1, logstore.ProducerAppend{ID: id, FirstSeq: 50}, "w"); err != nil || dup {
			errs <- fmt.Errorf("producer %d: next append = %v, %v", p, dup, err)
		}
	})
	close(stop)
	if err := <-plain; err != nil {
		t.Fatal(err)
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	counts := map[string]int{}
	for _, rec := range readAll(t, r) {
		if len(rec.GetProducerId()) != 0 {
			counts[fmt.Sprintf("%x/%d", rec.GetProducerId()[:1], rec.GetProducerSequence())]++
		}
	}
	if len(counts) != producers*51 {
		t.Errorf("%d distinct producer records, want %d", len(counts), producers*51)
	}
	for k, n := range counts {
		if n != 1 {
			t.Errorf("%s written %d times", k, n)
		}
	}
}
