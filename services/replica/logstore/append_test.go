package logstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

func TestAppendReadRoundTripAcrossReopen(t *testing.T) {
	o := newOpener(t)
	s := o.open()
	ids := []string{"r1", "r2", "r10"}
	for _, id := range ids {
		r := mustRange(t, s, id)
		lead(t, r, 1)
		appendN(t, r, 1, 5)
		lead(t, r, 3) // epoch 2 never led here
		appendN(t, r, 3, 7)
		// Empty and large values are records like any other.
		if _, err := r.Append(3, false, [][]byte{{}, bytes.Repeat([]byte{0xab}, 100<<10)}); err != nil {
			t.Fatalf("Append(empty, 100 KiB) = %v", err)
		}
	}
	want := map[string][]*tenurev1.Record{}
	for _, id := range ids {
		r, _ := s.Range(id)
		if r.LogEnd() != 16 {
			t.Fatalf("%s: LogEnd() = %d, want 16", id, r.LogEnd())
		}
		waitDurable(t, r, 16)
		want[id] = readAll(t, r)
		checkHistory(t, r, es(1, 0, 3, 6))
		checkConsistent(t, r)
		recs := want[id]
		if !recs[0].GetEpochStart() || !recs[6].GetEpochStart() || recs[1].GetEpochStart() {
			t.Errorf("%s: epoch-start flags at 0, 6, 1 = %v, %v, %v; want true, true, false", id, recs[0].GetEpochStart(), recs[6].GetEpochStart(), recs[1].GetEpochStart())
		}
		if got, want := recs[3].GetValue(), value(id, 3); !bytes.Equal(got, want) {
			t.Errorf("%s: record 3 value %q, want %q", id, got, want)
		}
	}
	closeStore(t, s)

	s = o.open()
	defer closeStore(t, s)
	if got := s.RangeIDs(); !slices.Equal(got, []string{"r1", "r10", "r2"}) {
		t.Fatalf("RangeIDs() = %v", got)
	}
	for _, id := range ids {
		r, ok := s.Range(id)
		if !ok {
			t.Fatalf("Range(%s) missing after reopen", id)
		}
		if r.LogEnd() != 16 || r.DurableEnd() != 16 || r.LastEpoch() != 3 {
			t.Errorf("%s after reopen: LogEnd, DurableEnd, LastEpoch = %d, %d, %d; want 16, 16, 3", id, r.LogEnd(), r.DurableEnd(), r.LastEpoch())
		}
		got := readAll(t, r)
		if len(got) != len(want[id]) {
			t.Fatalf("%s: %d records after reopen, want %d", id, len(got), len(want[id]))
		}
		for i := range got {
			g, w := got[i], want[id][i]
			if g.GetOffset() != w.GetOffset() || g.GetEpoch() != w.GetEpoch() || g.GetEpochStart() != w.GetEpochStart() || !bytes.Equal(g.GetValue(), w.GetValue()) {
				t.Errorf("%s: record %d after reopen = %v, want %v", id, i, g, w)
			}
		}
		checkHistory(t, r, es(1, 0, 3, 6))
		if e, err := r.EpochAt(2); err != nil || e != 1 {
			t.Errorf("%s: EpochAt(2) = %d, %v; want 1", id, e, err)
		}
		if _, err := r.EpochAt(16); !errors.Is(err, logstore.ErrOutOfRange) {
			t.Errorf("%s: EpochAt(16) = %v, want ErrOutOfRange", id, err)
		}
	}
}

func TestReadBounds(t *testing.T) {
	s := newOpener(t).open()
	defer closeStore(t, s)
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	for range 4 {
		if _, err := r.Append(1, false, [][]byte{make([]byte, 100)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		from             uint64
		maxRecs, maxByte int
		want             int
	}{
		{from: 0, want: 5},
		{from: 1, maxRecs: 2, want: 2},
		{from: 1, maxByte: 250, want: 2},
		{from: 1, maxByte: 1, want: 1}, // at least one record
		{from: 5, want: 0},
	} {
		recs, err := r.Read(tc.from, tc.maxRecs, tc.maxByte)
		if err != nil || len(recs) != tc.want {
			t.Errorf("Read(%d, %d, %d) = %d records, %v; want %d", tc.from, tc.maxRecs, tc.maxByte, len(recs), err, tc.want)
		}
		for i, rec := range recs {
			if rec.GetOffset() != tc.from+uint64(i) {
				t.Errorf("Read(%d)[%d] has offset %d", tc.from, i, rec.GetOffset())
			}
		}
	}
	if _, err := r.Read(6, 0, 0); !errors.Is(err, logstore.ErrOutOfRange) {
		t.Errorf("Read(6) beyond the log end = %v, want ErrOutOfRange", err)
	}
}

func TestConcurrentAppendsGetContiguousOffsets(t *testing.T) {
	s := newOpener(t).open()
	defer closeStore(t, s)
	ids := []string{"a", "b"}
	for _, id := range ids {
		lead(t, mustRange(t, s, id), 1)
	}
	const writers, appends = 24, 20
	type span struct{ base, n uint64 }
	var mu sync.Mutex
	spans := map[string][]span{}
	parallel(writers*len(ids), func(g int) {
		id := ids[g%len(ids)]
		r, _ := s.Range(id)
		for k := range appends {
			n := 1 + (g+k)%3
			var vals [][]byte
			for i := range n {
				vals = append(vals, fmt.Appendf(nil, "%d/%d/%d", g, k, i))
			}
			base, err := r.Append(1, false, vals)
			if err != nil {
				t.Errorf("Append = %v", err)
				return
			}
			mu.Lock()
			spans[id] = append(spans[id], span{base, uint64(n)})
			mu.Unlock()
			// The records are readable as soon as Append returns.
			recs, err := r.Read(base, n, 0)
			if err != nil || len(recs) != n || !bytes.Equal(recs[0].GetValue(), vals[0]) {
				t.Errorf("Read(%d, %d) right after Append = %d records, %v", base, n, len(recs), err)
			}
		}
	})
	for _, id := range ids {
		r, _ := s.Range(id)
		sp := spans[id]
		sort.Slice(sp, func(i, j int) bool { return sp[i].base < sp[j].base })
		next := uint64(1) // offset 0 is the epoch-start record
		for _, x := range sp {
			if x.base != next {
				t.Fatalf("%s: a caller got base %d, want %d: offsets overlap or leave a gap", id, x.base, next)
			}
			next += x.n
		}
		if r.LogEnd() != next {
			t.Fatalf("%s: LogEnd() = %d, the callers' spans end at %d", id, r.LogEnd(), next)
		}
		// Each batch's values sit together, in order.
		recs := readAll(t, r)
		for _, x := range sp {
			var g, k int
			if _, err := fmt.Sscanf(string(recs[x.base].GetValue()), "%d/%d/0", &g, &k); err != nil {
				t.Fatalf("%s: record %d = %q, want the first value of a batch", id, x.base, recs[x.base].GetValue())
			}
			for i := range x.n {
				if want := fmt.Sprintf("%d/%d/%d", g, k, i); string(recs[x.base+i].GetValue()) != want {
					t.Fatalf("%s: record %d = %q, want %q", id, x.base+i, recs[x.base+i].GetValue(), want)
				}
			}
		}
	}
}

func TestGroupCommitSharesSyncs(t *testing.T) {
	s := newOpener(t).open()
	defer closeStore(t, s)
	r := mustRange(t, s, "r1")
	lead(t, r, 1)
	waitDurable(t, r, 1)
	before := s.Stats()
	const appenders, each = 64, 10
	parallel(appenders, func(int) {
		for range each {
			base, err := r.Append(1, false, [][]byte{make([]byte, 1024)})
			if err != nil {
				t.Errorf("Append = %v", err)
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err = r.WaitDurable(ctx, base+1)
			cancel()
			if err != nil {
				t.Errorf("WaitDurable(%d) = %v", base+1, err)
				return
			}
		}
	})
	after := s.Stats()
	syncs, commits := after.Syncs-before.Syncs, after.Commits-before.Commits
	t.Logf("%d appends: %d commits, %d syncs", appenders*each, commits, syncs)
	if syncs >= appenders*each {
		t.Fatalf("%d appends took %d syncs: group commit did not share them", appenders*each, syncs)
	}
	if r.DurableEnd() != 1+appenders*each {
		t.Fatalf("DurableEnd() = %d, want %d", r.DurableEnd(), 1+appenders*each)
	}
}

func TestLeaderAppendRules(t *testing.T) {
	s := newOpener(t).open()
	defer closeStore(t, s)
	r := mustRange(t, s, "r1")

	if _, err := r.Append(1, true, [][]byte{{}}); !errors.Is(err, logstore.ErrUnjournaled) {
		t.Errorf("Append before RecordEpoch = %v, want ErrUnjournaled", err)
	}
	if err := r.RecordEpoch(1, 3); !errors.Is(err, logstore.ErrOutOfRange) {
		t.Errorf("RecordEpoch(1, 3) on an empty log = %v, want ErrOutOfRange", err)
	}
	if err := r.RecordEpoch(2, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Append(2, false, [][]byte{[]byte("x")}); !errors.Is(err, logstore.ErrInvalid) {
		t.Errorf("first record of an epoch not its start record = %v, want ErrInvalid", err)
	}
	if _, err := r.Append(2, true, [][]byte{[]byte("x")}); !errors.Is(err, logstore.ErrInvalid) {
		t.Errorf("epoch-start record with a value = %v, want ErrInvalid", err)
	}
	if _, err := r.Append(2, true, [][]byte{{}}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Append(2, true, [][]byte{{}}); !errors.Is(err, logstore.ErrInvalid) {
		t.Errorf("second epoch-start record = %v, want ErrInvalid", err)
	}
	if _, err := r.Append(1, false, [][]byte{[]byte("x")}); !errors.Is(err, logstore.ErrStaleEpoch) {
		t.Errorf("Append under an older epoch = %v, want ErrStaleEpoch", err)
	}
	if err := r.RecordEpoch(1, 1); !errors.Is(err, logstore.ErrStaleEpoch) {
		t.Errorf("RecordEpoch under an older epoch = %v, want ErrStaleEpoch", err)
	}
	if _, err := r.Append(0, false, [][]byte{[]byte("x")}); !errors.Is(err, logstore.ErrInvalid) {
		t.Errorf("Append(epoch 0) = %v, want ErrInvalid", err)
	}
	if _, err := r.Append(2, false, nil); !errors.Is(err, logstore.ErrInvalid) {
		t.Errorf("Append(no values) = %v, want ErrInvalid", err)
	}
	// A newer epoch journaled: this leader was superseded.
	if err := r.RecordEpoch(3, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Append(2, false, [][]byte{[]byte("x")}); !errors.Is(err, logstore.ErrStaleEpoch) {
		t.Errorf("Append under a superseded epoch = %v, want ErrStaleEpoch", err)
	}
	if _, err := r.Append(4, true, [][]byte{{}}); !errors.Is(err, logstore.ErrUnjournaled) {
		t.Errorf("Append under an unjournaled epoch = %v, want ErrUnjournaled", err)
	}
	checkHistory(t, r, es(2, 0, 3, 1))
	checkConsistent(t, r)
}

// rec is a fetched record.
func rec(off, epoch uint64, start bool, v string) *tenurev1.Record {
	var val []byte
	if v != "" {
		val = []byte(v)
	}
	return &tenurev1.Record{Offset: off, Epoch: epoch, EpochStart: start, Value: val}
}

func TestFollowerJournalsEpochsAtTheirOwnOffsets(t *testing.T) {
	o := newOpener(t)
	s := o.open()
	r := mustRange(t, s, "r1")

	// The follower joins with an empty log and receives the leader's log,
	// which spans epochs 1 and 3, then epoch 4 in a later fetch.
	if err := r.AppendRecords([]*tenurev1.Record{
		rec(0, 1, true, ""), rec(1, 1, false, "a"), rec(2, 1, false, "b"),
		rec(3, 3, true, ""), rec(4, 3, false, "c"),
	}); err != nil {
		t.Fatalf("AppendRecords = %v", err)
	}
	checkHistory(t, r, es(1, 0, 3, 3))
	if err := r.AppendRecords([]*tenurev1.Record{rec(5, 3, false, "d"), rec(6, 4, true, ""), rec(7, 4, false, "e")}); err != nil {
		t.Fatalf("AppendRecords = %v", err)
	}
	checkHistory(t, r, es(1, 0, 3, 3, 4, 6))
	checkConsistent(t, r)

	for name, tc := range map[string]struct {
		recs []*tenurev1.Record
		want error
	}{
		"gap from the log end":      {[]*tenurev1.Record{rec(9, 4, false, "x")}, logstore.ErrOutOfRange},
		"below the log end":         {[]*tenurev1.Record{rec(7, 4, false, "x")}, logstore.ErrOutOfRange},
		"gap inside the batch":      {[]*tenurev1.Record{rec(8, 4, false, "x"), rec(10, 4, false, "y")}, logstore.ErrInvalid},
		"out of order":              {[]*tenurev1.Record{rec(8, 4, false, "x"), rec(8, 4, false, "y")}, logstore.ErrInvalid},
		"decreasing inside batch":   {[]*tenurev1.Record{rec(8, 5, true, ""), rec(9, 4, false, "y")}, logstore.ErrInvalid},
		"below the log's epoch":     {[]*tenurev1.Record{rec(8, 3, false, "x")}, logstore.ErrStaleEpoch},
		"epoch 0":                   {[]*tenurev1.Record{rec(8, 0, false, "x")}, logstore.ErrInvalid},
		"start record with a value": {[]*tenurev1.Record{rec(8, 5, true, "x")}, logstore.ErrInvalid},
		"start record mid-epoch":    {[]*tenurev1.Record{rec(8, 4, true, "")}, logstore.ErrInvalid},
		"nil record":                {[]*tenurev1.Record{nil}, logstore.ErrInvalid},
		"no records":                {nil, logstore.ErrInvalid},
	} {
		if err := r.AppendRecords(tc.recs); !errors.Is(err, tc.want) {
			t.Errorf("%s: AppendRecords = %v, want %v", name, err, tc.want)
		}
	}
	if r.LogEnd() != 8 {
		t.Fatalf("refused batches changed the log: LogEnd() = %d, want 8", r.LogEnd())
	}
	checkHistory(t, r, es(1, 0, 3, 3, 4, 6))
	closeStore(t, s)

	s = o.open()
	defer closeStore(t, s)
	r, _ = s.Range("r1")
	checkHistory(t, r, es(1, 0, 3, 3, 4, 6))
	checkConsistent(t, r)
}

func TestFollowerDropsEpochsThatWroteNothing(t *testing.T) {
	s := newOpener(t).open()
	defer closeStore(t, s)
	r := mustRange(t, s, "r1")
	lead(t, r, 2)
	appendN(t, r, 2, 2)
	// This replica led epoch 5 just long enough to journal it, then was
	// deposed before its epoch-start record. The new leader of epoch 6 never
	// saw epoch 5 and holds more of epoch 2 at offset 3.
	if err := r.RecordEpoch(5, 3); err != nil {
		t.Fatal(err)
	}
	checkHistory(t, r, es(2, 0, 5, 3))
	if err := r.AppendRecords([]*tenurev1.Record{rec(3, 2, false, "x"), rec(4, 6, true, "")}); err != nil {
		t.Fatalf("AppendRecords = %v", err)
	}
	checkHistory(t, r, es(2, 0, 6, 4))
	checkConsistent(t, r)
}
