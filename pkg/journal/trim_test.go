package journal_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/tenurelog/tenure/pkg/journal"
	"github.com/tenurelog/tenure/pkg/journal/journaltest"
)

// TrimBefore keeps the entry in force at the offset and every later one,
// on disk (reopened) as in memory, and the journal stays appendable.
func TestTrimBefore(t *testing.T) {
	for _, tt := range []struct {
		name   string
		offset uint64
		want   []journal.EpochStart
	}{
		{"below every start after the first", 50, es(1, 0, 2, 100, 3, 200)},
		{"exactly at a start", 100, es(2, 100, 3, 200)},
		{"inside a stretch", 150, es(2, 100, 3, 200)},
		{"inside the last stretch", 250, es(3, 200)},
		{"far beyond", 1 << 40, es(3, 200)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := writeJournal(t, image(es(1, 0, 2, 100, 3, 200)...))
			j := mustOpen(t, path)
			if err := j.TrimBefore(tt.offset); err != nil {
				t.Fatal(err)
			}
			wantEntries(t, j, tt.want)
			mustRecord(t, j, es(7, 900)...)
			_ = j.Close()
			wantEntries(t, mustOpen(t, path), append(slices.Clone(tt.want), es(7, 900)...))
		})
	}
}

// TrimBefore under a power cut at every point: the journal after the
// crash is the old history or the trimmed one, never a mix or corrupt, and
// the trimmed one once TrimBefore returned.
func TestCrashDuringTrimBefore(t *testing.T) {
	old, trimmed := es(1, 0, 2, 100, 3, 200), es(2, 100, 3, 200)
	scenario := func(fsys journal.FS) int {
		j, err := journal.OpenFS(fsys, "r1.journal")
		if err != nil {
			return 0
		}
		defer j.Close()
		if err := j.TrimBefore(150); err != nil {
			return 0
		}
		return -1
	}
	crashEverywhere(t, image(old...), scenario, func(t *testing.T, crashed *journaltest.MemFS, completed int) {
		j := mustOpenFS(t, crashed, "r1.journal")
		got := j.Entries()
		switch {
		case slices.Equal(got, trimmed):
		case completed < 0:
			t.Fatalf("TrimBefore returned nil, but after the crash the journal holds %v, want %v", got, trimmed)
		case !slices.Equal(got, old):
			t.Fatalf("after the crash the journal holds %v, want the old %v or the trimmed %v", got, old, trimmed)
		}
		mustRecord(t, j, es(9, 1000)...)
	})
}

// A failed step of TrimBefore poisons the journal (it reads empty, never
// partial) and leaves a whole journal on disk: the old one before the
// rename, the trimmed one after it.
func TestTrimBeforeFailurePoisons(t *testing.T) {
	old, trimmed := es(1, 0, 2, 100, 3, 200), es(2, 100, 3, 200)
	for _, tt := range []struct {
		op   journaltest.Op
		want []journal.EpochStart
	}{
		{journaltest.OpSync, old},
		{journaltest.OpRename, old},
		{journaltest.OpSyncDir, trimmed},
	} {
		t.Run(tt.op.String(), func(t *testing.T) {
			mem := journaltest.NewMemFS()
			mem.WriteFile("r1.journal", image(old...))
			fsys := journaltest.NewFaultFS(mem)
			j := mustOpenFS(t, fsys, "r1.journal")
			fsys.SetInjector(journaltest.FailOp(tt.op, errors.New("disk says no")))
			if err := j.TrimBefore(150); !errors.Is(err, journal.ErrPoisoned) {
				t.Fatalf("TrimBefore with a failing %v = %v, want ErrPoisoned", tt.op, err)
			}
			wantEntries(t, j, nil)
			if err := j.Record(9, 1000); !errors.Is(err, journal.ErrPoisoned) {
				t.Fatalf("Record after a failed trim = %v, want ErrPoisoned", err)
			}
			_ = j.Close()
			fsys.SetInjector(nil)
			wantEntries(t, mustOpenFS(t, fsys, "r1.journal"), tt.want)
		})
	}
}
