package logstore_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/tenurelog/tenure/pkg/journal"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

// The tests that touch Badger directly build keys and values from the
// format the package comment documents, with their own encoder, so a change
// to the on-disk format fails them.

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func logKey(id string, off uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte("l/"+id+"/"), off)
}

// u64Value encodes an h/, d/ or t/ value stored under key.
func u64Value(key string, v uint64) []byte {
	b := binary.BigEndian.AppendUint64(nil, v)
	crc := crc32.Update(crc32.Checksum([]byte(key), castagnoli), castagnoli, b)
	return binary.BigEndian.AppendUint32(b, crc)
}

// testLogger sends the store's logs to t.Log, so they show only on failure.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

// opener opens (and reopens) one store directory.
type opener struct {
	t    testing.TB
	dir  string
	opts logstore.Options
}

func newOpener(t testing.TB) *opener {
	return &opener{t: t, dir: t.TempDir(), opts: logstore.Options{Logger: testLogger(t)}}
}

func (o *opener) open() *logstore.Store {
	o.t.Helper()
	s, err := logstore.Open(o.dir, o.opts)
	if err != nil {
		o.t.Fatalf("Open(%s) = %v", o.dir, err)
	}
	return s
}

func (o *opener) journalPath(id string) string {
	return filepath.Join(o.dir, "journal", id+".journal")
}

// rawDB opens the store's Badger database directly; the store must be closed.
func (o *opener) rawDB() *badger.DB {
	o.t.Helper()
	db, err := badger.Open(badger.DefaultOptions(filepath.Join(o.dir, "badger")).WithLogger(nil))
	if err != nil {
		o.t.Fatalf("open badger: %v", err)
	}
	return db
}

// losePower cuts s's power (PowerLoss), closes it and leaves its files as
// the loss could.
func losePower(t testing.TB, s *logstore.Store) {
	t.Helper()
	after := s.PowerLoss()
	_ = s.Close()
	if err := after(); err != nil {
		t.Fatalf("PowerLoss: %v", err)
	}
}

func closeStore(t testing.TB, s *logstore.Store) {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}
}

func mustRange(t testing.TB, s *logstore.Store, id string) *logstore.Range {
	t.Helper()
	r, err := s.CreateRange(id)
	if err != nil {
		t.Fatalf("CreateRange(%s) = %v", id, err)
	}
	return r
}

// lead makes r's replica leader of epoch: journal (epoch, LogEnd), then the
// epoch-start record, as Adopt does.
func lead(t testing.TB, r *logstore.Range, epoch uint64) {
	t.Helper()
	if err := r.RecordEpoch(epoch, r.LogEnd()); err != nil {
		t.Fatalf("RecordEpoch(%d, %d) = %v", epoch, r.LogEnd(), err)
	}
	if _, err := r.Append(epoch, true, [][]byte{{}}); err != nil {
		t.Fatalf("Append(%d, epochStart) = %v", epoch, err)
	}
}

// value is a recognizable payload for record i of range id.
func value(id string, i uint64) []byte { return fmt.Appendf(nil, "%s/%d", id, i) }

// appendN appends n records one batch at a time under epoch and returns the
// base offset.
func appendN(t testing.TB, r *logstore.Range, epoch uint64, n int) uint64 {
	t.Helper()
	var vals [][]byte
	end := r.LogEnd()
	for i := range n {
		vals = append(vals, value(r.ID(), end+uint64(i)))
	}
	base, err := r.Append(epoch, false, vals)
	if err != nil {
		t.Fatalf("Append(%d, %d values) = %v", epoch, n, err)
	}
	return base
}

// waitDurable waits, bounded, for r's DurableEnd to reach off.
func waitDurable(t testing.TB, r *logstore.Range, off uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.WaitDurable(ctx, off); err != nil {
		t.Fatalf("WaitDurable(%d) = %v", off, err)
	}
}

// readAll reads r's whole log.
func readAll(t testing.TB, r *logstore.Range) []*tenurev1.Record {
	t.Helper()
	var out []*tenurev1.Record
	for from := r.LogStart(); from < r.LogEnd(); {
		recs, err := r.Read(from, 0, 0)
		if err != nil {
			t.Fatalf("Read(%d) = %v", from, err)
		}
		out = append(out, recs...)
		from += uint64(len(recs))
	}
	return out
}

// checkConsistent checks that r's journal describes its log: every entry
// starts at or below LogEnd, offsets are dense from LogStart, and each record's epoch is
// the epoch of the last entry starting at or below it.
func checkConsistent(t testing.TB, r *logstore.Range) {
	t.Helper()
	h, recs, start, end := r.History(), readAll(t, r), r.LogStart(), r.LogEnd()
	if end > start && len(h) == 0 {
		t.Fatalf("range %s: empty history with log end %d", r.ID(), end)
	}
	for _, e := range h {
		if e.Start > end {
			t.Errorf("range %s: history %v has an entry beyond the log end %d", r.ID(), h, end)
		}
	}
	for i, rec := range recs {
		if rec.GetOffset() != start+uint64(i) {
			t.Fatalf("range %s: record %d has offset %d", r.ID(), i, rec.GetOffset())
		}
		var want uint64
		for _, e := range h {
			if e.Start <= rec.GetOffset() {
				want = e.Epoch
			}
		}
		if rec.GetEpoch() != want {
			t.Errorf("range %s: record %d has epoch %d, history %v says %d", r.ID(), i, rec.GetEpoch(), h, want)
		}
	}
	if n := len(recs); n > 0 && recs[n-1].GetEpoch() != r.LastEpoch() {
		t.Errorf("range %s: LastEpoch() = %d, last record has %d", r.ID(), r.LastEpoch(), recs[n-1].GetEpoch())
	}
}

func es(pairs ...uint64) []journal.EpochStart {
	var h []journal.EpochStart
	for i := 0; i+1 < len(pairs); i += 2 {
		h = append(h, journal.EpochStart{Epoch: pairs[i], Start: pairs[i+1]})
	}
	return h
}

func checkHistory(t testing.TB, r *logstore.Range, want []journal.EpochStart) {
	t.Helper()
	if got := r.History(); !slices.Equal(got, want) {
		t.Fatalf("range %s: History() = %v, want %v", r.ID(), got, want)
	}
}

// parallel runs fn(i) for i in [0, n) concurrently and waits.
func parallel(n int, fn func(i int)) {
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { fn(i) })
	}
	wg.Wait()
}

// appendAcrossSwitches appends n 1 KiB records to r one at a time, waiting
// after each for any WAL checkpoint it started: with small WAL sizes
// (SetWALSizes) that crosses a switch every few records, and each file
// then grows past the switch size by at most one batch.
func appendAcrossSwitches(t testing.TB, s *logstore.Store, r *logstore.Range, n int) {
	t.Helper()
	for range n {
		if _, err := r.Append(1, false, [][]byte{make([]byte, 1024)}); err != nil {
			t.Fatal(err)
		}
		s.WaitWALCheckpoint()
	}
}
