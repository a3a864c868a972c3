package journal_test

import (
	"bytes"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tenurelog/tenure/pkg/journal"
	"github.com/tenurelog/tenure/pkg/journal/journaltest"
)

// wantPoisoned checks everything a poisoned journal promises: reads report an
// unknown history, and every change is refused, also once the disk is fine.
func wantPoisoned(t *testing.T, fsys *journaltest.FaultFS, j *journal.Journal) {
	t.Helper()
	wantEntries(t, j, nil)
	fsys.SetInjector(nil)
	for _, err := range []error{j.Record(100, 1<<20), j.TruncateFrom(0)} {
		wantErrIs(t, "change of a poisoned journal", err, journal.ErrPoisoned)
		if !strings.Contains(err.Error(), "reopen") || !errors.Is(err, journaltest.ErrInjected) {
			t.Fatalf("poisoned journal error = %q, want it to say to reopen and to carry the first failure", err)
		}
	}
}

func TestFailedWritePoisons(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r1.journal")
	fsys := journaltest.NewFaultFS(journal.OSFS{})
	j := mustOpenFS(t, fsys, path)
	mustRecord(t, j, es(1, 0)...)

	fsys.SetInjector(journaltest.FailOp(journaltest.OpWrite, journaltest.ErrInjected))
	err := j.Record(2, 100)
	wantErrIs(t, "Record with a failing write", err, journal.ErrPoisoned)
	wantErrIs(t, "Record with a failing write", err, journaltest.ErrInjected)
	wantPoisoned(t, fsys, j)

	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	wantEntries(t, mustOpen(t, path), es(1, 0))
}

// A write that tore part-way leaves a fragment; the reopen cuts it, and the
// next entry lands on the boundary (the second reopen proves it).
func TestTornWritePoisonsAndReopenCuts(t *testing.T) {
	for n := 1; n < 20; n++ {
		path := filepath.Join(t.TempDir(), "r1.journal")
		fsys := journaltest.NewFaultFS(journal.OSFS{})
		j := mustOpenFS(t, fsys, path)
		mustRecord(t, j, es(1, 0)...)
		fsys.SetInjector(journaltest.FailOp(journaltest.OpWrite, &journaltest.ShortWrite{N: n}))
		wantErrIs(t, "Record with a torn write", j.Record(2, 100), journal.ErrPoisoned)
		if got := len(readFile(t, path)); got != 8+20+n {
			t.Fatalf("torn write of %d bytes left a %d-byte file, want %d", n, got, 8+20+n)
		}
		wantEntries(t, j, nil)
		_ = j.Close()

		j = mustOpen(t, path)
		wantEntries(t, j, es(1, 0))
		mustRecord(t, j, es(2, 100)...)
		_ = j.Close()
		wantEntries(t, mustOpen(t, path), es(1, 0, 2, 100))
	}
}

// A failed fsync means the entry may never reach the disk. After a crash,
// the reopen recovers exactly the durable prefix.
func TestFailedSyncPoisons(t *testing.T) {
	mem := journaltest.NewMemFS()
	fsys := journaltest.NewFaultFS(mem)
	j := mustOpenFS(t, fsys, "r1.journal")
	mustRecord(t, j, es(1, 0, 2, 100)...)

	fsys.SetInjector(journaltest.FailOp(journaltest.OpSync, journaltest.ErrInjected))
	wantErrIs(t, "Record with a failing fsync", j.Record(3, 200), journal.ErrPoisoned)
	wantPoisoned(t, fsys, j)

	wantEntries(t, mustOpenFS(t, mem.Crash(), "r1.journal"), es(1, 0, 2, 100))
}

// On a real disk a failed fsync leaves the entry's fate unknown: the reopen
// must still succeed, with a history that is one of the two possibilities.
func TestFailedSyncOnDiskReopens(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r1.journal")
	fsys := journaltest.NewFaultFS(journal.OSFS{})
	j := mustOpenFS(t, fsys, path)
	mustRecord(t, j, es(1, 0)...)
	fsys.SetInjector(journaltest.FailOp(journaltest.OpSync, journaltest.ErrInjected))
	wantErrIs(t, "Record with a failing fsync", j.Record(2, 100), journal.ErrPoisoned)
	wantPoisoned(t, fsys, j)
	_ = j.Close()

	got := mustOpen(t, path).Entries()
	if !slices.Equal(got, es(1, 0)) && !slices.Equal(got, es(1, 0, 2, 100)) {
		t.Fatalf("reopen after a failed fsync = %v, want [(1,0)] or [(1,0) (2,100)]", got)
	}
}

func TestFailedTruncatePoisons(t *testing.T) {
	h := es(1, 0, 2, 100, 3, 200)
	for _, op := range []journaltest.Op{journaltest.OpTruncate, journaltest.OpSync} {
		t.Run(op.String(), func(t *testing.T) {
			mem := journaltest.NewMemFS()
			fsys := journaltest.NewFaultFS(mem)
			j := mustOpenFS(t, fsys, "r1.journal")
			mustRecord(t, j, h...)

			fsys.SetInjector(journaltest.FailOp(op, journaltest.ErrInjected))
			wantErrIs(t, "TruncateFrom with a failing "+op.String(), j.TruncateFrom(100), journal.ErrPoisoned)
			wantPoisoned(t, fsys, j)

			// The cut never became durable: after a crash the whole history
			// is back, which is safe (the caller was told the cut failed).
			wantEntries(t, mustOpenFS(t, mem.Crash(), "r1.journal"), h)
		})
	}
}

// A poisoned journal recovers by reopening, and the reopened file is one a
// further Record extends cleanly.
func TestReopenAfterPoisonIsAppendable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r1.journal")
	fsys := journaltest.NewFaultFS(journal.OSFS{})
	j := mustOpenFS(t, fsys, path)
	mustRecord(t, j, es(1, 0)...)
	fsys.SetInjector(journaltest.FailOp(journaltest.OpWrite, &journaltest.ShortWrite{N: 9}))
	_ = j.Record(2, 100)
	_ = j.Close()
	fsys.SetInjector(nil)

	j = mustOpenFS(t, fsys, path)
	mustRecord(t, j, es(2, 100, 3, 200)...)
	_ = j.Close()
	if got, want := readFile(t, path), image(es(1, 0, 2, 100, 3, 200)...); !bytes.Equal(got, want) {
		t.Fatalf("file = %x, want %x", got, want)
	}
}
