package journal_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/tenurelog/tenure/pkg/journal"
	"github.com/tenurelog/tenure/pkg/journal/journaltest"
)

// crashEverywhere runs scenario against a MemFS holding initial, with a power
// cut after each possible number of filesystem operations in turn, until the
// scenario runs to the end. After every cut it opens the crashed filesystem
// and hands the result to check. The scenario returns how many of its steps
// completed (returned nil) before the cut.
func crashEverywhere(t *testing.T, initial []byte, scenario func(fsys journal.FS) int, check func(t *testing.T, crashed *journaltest.MemFS, completed int)) {
	t.Helper()
	for n := 0; ; n++ {
		mem := journaltest.NewMemFS()
		if initial != nil {
			mem.WriteFile("r1.journal", initial)
		}
		fsys := journaltest.NewFaultFS(mem)
		fsys.SetInjector(journaltest.After(n))
		completed := scenario(fsys)
		t.Run(fmt.Sprintf("cut after %d ops", n), func(t *testing.T) {
			check(t, mem.Crash(), completed)
		})
		if completed < 0 {
			return // the scenario ran to the end without reaching the cut
		}
		if n > 1000 {
			t.Fatal("scenario never completes")
		}
	}
}

// Record and TruncateFrom under a power cut at every point: the journal
// after the crash is exactly the history as of the last step that returned
// nil, or the one after it, and is appendable.
func TestCrashDuringRecordAndTruncate(t *testing.T) {
	states := [][]journal.EpochStart{
		es(1, 0),
		es(1, 0, 2, 100),
		es(1, 0, 2, 100, 3, 200),
		es(1, 0, 2, 100),
		es(1, 0, 2, 100, 4, 150),
	}
	steps := []func(*journal.Journal) error{
		func(j *journal.Journal) error { return j.Record(2, 100) },
		func(j *journal.Journal) error { return j.Record(3, 200) },
		func(j *journal.Journal) error { return j.TruncateFrom(150) },
		func(j *journal.Journal) error { return j.Record(4, 150) },
	}
	scenario := func(fsys journal.FS) int {
		j, err := journal.OpenFS(fsys, "r1.journal")
		if err != nil {
			return 0
		}
		defer j.Close()
		for i, step := range steps {
			if err := step(j); err != nil {
				return i
			}
		}
		return -1
	}
	crashEverywhere(t, image(states[0]...), scenario, func(t *testing.T, crashed *journaltest.MemFS, completed int) {
		if completed < 0 {
			completed = len(steps)
		}
		j := mustOpenFS(t, crashed, "r1.journal")
		got := j.Entries()
		allowed := states[completed:min(completed+2, len(states))]
		if !slices.ContainsFunc(allowed, func(s []journal.EpochStart) bool { return slices.Equal(got, s) }) {
			t.Fatalf("after %d steps completed, recovered %v, want one of %v", completed, got, allowed)
		}
		mustRecord(t, j, es(9, 1000)...)
		_ = j.Close()
		wantEntries(t, mustOpenFS(t, crashed, "r1.journal"), append(got, es(9, 1000)...))
	})
}

// Creating a journal under a power cut at every point: after the crash, Open
// succeeds on an empty history or the new journal's header, never fails.
func TestCrashDuringCreateOnOpen(t *testing.T) {
	scenario := func(fsys journal.FS) int {
		j, err := journal.OpenFS(fsys, "data/r1.journal")
		if err != nil {
			return 0
		}
		_ = j.Close()
		return -1
	}
	crashEverywhere(t, nil, scenario, func(t *testing.T, crashed *journaltest.MemFS, completed int) {
		j := mustOpenFS(t, crashed, "data/r1.journal")
		wantEntries(t, j, nil)
		if completed < 0 {
			// Open returned nil, so the file must have survived as is.
			if _, err := crashed.ReadFile("data/r1.journal"); err != nil {
				t.Fatalf("Open returned nil but the journal did not survive the crash: %v", err)
			}
		}
	})
}

// Create replaces a journal atomically: after a power cut at any point, the
// journal is the old history or the new one, never a mix, never corrupt; and
// once Create has returned, it is the new one.
func TestCrashDuringCreate(t *testing.T) {
	old, rebuilt := es(1, 0, 2, 100), es(1, 0, 3, 80, 5, 400)
	for _, tt := range []struct {
		name    string
		initial []byte
		before  []journal.EpochStart
		corrupt bool // initial is refused by Open
	}{
		{"replacing a journal", image(old...), old, false},
		{"replacing a corrupt journal", []byte("TNRJRNL\x01garbage, not entries..."), nil, true},
		{"no journal yet", nil, nil, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			scenario := func(fsys journal.FS) int {
				j, err := journal.CreateFS(fsys, "r1.journal", rebuilt)
				if err != nil {
					return 0
				}
				_ = j.Close()
				return -1
			}
			crashEverywhere(t, tt.initial, scenario, func(t *testing.T, crashed *journaltest.MemFS, completed int) {
				j, err := journal.OpenFS(crashed, "r1.journal")
				if err != nil {
					if completed >= 0 && tt.corrupt && errors.Is(err, journal.ErrCorrupt) {
						return // the corrupt original is still there: not replaced, not damaged
					}
					t.Fatalf("after the crash OpenFS = %v", err)
				}
				defer j.Close()
				got := j.Entries()
				switch {
				case slices.Equal(got, rebuilt):
				case completed < 0:
					t.Fatalf("Create returned nil, but after the crash the journal holds %v, want %v", got, rebuilt)
				case !slices.Equal(got, tt.before):
					t.Fatalf("after the crash the journal holds %v, want the old %v or the new %v", got, tt.before, rebuilt)
				}
			})
		})
	}
}
