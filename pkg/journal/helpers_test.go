package journal_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tenurelog/tenure/pkg/journal"
)

// The tests build files from the documented format with their own encoder,
// not the package's, so a change to the on-disk format fails them.

var fileHeader = []byte("TNRJRNL\x01")

// rawEntry encodes one entry as the package comment documents it.
func rawEntry(epoch, start uint64) []byte {
	b := binary.BigEndian.AppendUint64(nil, epoch)
	b = binary.BigEndian.AppendUint64(b, start)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)))
}

// image is a whole journal file holding h.
func image(h ...journal.EpochStart) []byte {
	b := slices.Clone(fileHeader)
	for _, e := range h {
		b = append(b, rawEntry(e.Epoch, e.Start)...)
	}
	return b
}

// es is shorthand for a history literal: es(1, 0, 2, 300) is [(1,0), (2,300)].
func es(pairs ...uint64) []journal.EpochStart {
	if len(pairs)%2 != 0 {
		panic("es: odd number of values")
	}
	var h []journal.EpochStart
	for i := 0; i < len(pairs); i += 2 {
		h = append(h, journal.EpochStart{Epoch: pairs[i], Start: pairs[i+1]})
	}
	return h
}

// writeJournal writes data as a journal file in a fresh directory.
func writeJournal(t testing.TB, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "r1.journal")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustOpen(t testing.TB, path string) *journal.Journal {
	t.Helper()
	j, err := journal.Open(path)
	if err != nil {
		t.Fatalf("Open(%s) = %v, want nil", path, err)
	}
	t.Cleanup(func() { _ = j.Close() })
	return j
}

func mustOpenFS(t testing.TB, fsys journal.FS, path string) *journal.Journal {
	t.Helper()
	j, err := journal.OpenFS(fsys, path)
	if err != nil {
		t.Fatalf("OpenFS(%s) = %v, want nil", path, err)
	}
	t.Cleanup(func() { _ = j.Close() })
	return j
}

func mustRecord(t testing.TB, j *journal.Journal, h ...journal.EpochStart) {
	t.Helper()
	for _, e := range h {
		if err := j.Record(e.Epoch, e.Start); err != nil {
			t.Fatalf("Record(%d, %d) = %v, want nil", e.Epoch, e.Start, err)
		}
	}
}

func wantEntries(t testing.TB, j *journal.Journal, want []journal.EpochStart) {
	t.Helper()
	if got := j.Entries(); !slices.Equal(got, want) {
		t.Fatalf("Entries() = %v, want %v", got, want)
	}
	latest, ok := j.Latest()
	switch {
	case len(want) == 0 && ok:
		t.Fatalf("Latest() = %v, true; want false for an empty history", latest)
	case len(want) > 0 && (!ok || latest != want[len(want)-1]):
		t.Fatalf("Latest() = %v, %v; want %v, true", latest, ok, want[len(want)-1])
	}
}

func wantErrIs(t testing.TB, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s = %v, want an error matching %v", what, err, target)
	}
}

// checkRules is the tests' own statement of the history rules.
func checkRules(h []journal.EpochStart) error {
	if len(h) > journal.MaxEntries {
		return fmt.Errorf("%d entries > MaxEntries %d", len(h), journal.MaxEntries)
	}
	for i, e := range h {
		if e.Epoch == 0 {
			return fmt.Errorf("entry %d: epoch 0", i)
		}
		if i > 0 && (e.Epoch <= h[i-1].Epoch || e.Start < h[i-1].Start) {
			return fmt.Errorf("entry %d %v does not advance from %v", i, e, h[i-1])
		}
	}
	return nil
}
