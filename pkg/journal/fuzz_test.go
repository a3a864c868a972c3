package journal_test

import (
	"bytes"
	"errors"
	"slices"
	"testing"

	"github.com/tenurelog/tenure/pkg/journal"
	"github.com/tenurelog/tenure/pkg/journal/journaltest"
)

// FuzzOpen writes arbitrary bytes as a journal file and opens it. Open never
// panics; it either refuses the file with ErrCorrupt and leaves it alone, or
// loads a history that obeys the rules, having only cut bytes from the end
// (or written the header of a headerless file), so that the file then holds
// exactly the loaded history and a further Record lands on a boundary.
//
// The file lives in a MemFS so the fuzzer spends its time in the parser and
// recovery rather than in fsync: on disk it managed about a thousand inputs a
// second. OSFS is a passthrough every other test exercises on real files.
func FuzzOpen(f *testing.F) {
	base := es(1, 0, 2, 100, 5, 100, 9, 4000)
	badLast := image(base...)
	badLast[len(badLast)-1] ^= 0x01
	badMiddle := image(base...)
	badMiddle[8+20+3] ^= 0x40
	for _, seed := range [][]byte{
		nil,
		fileHeader,
		fileHeader[:5],
		image(es(1, 0)...),
		image(base...),
		append(image(base...), rawEntry(10, 5000)[:13]...), // torn
		badLast,
		badMiddle,
		image(es(1, 100, 2, 50)...), // start decreasing
		image(es(2, 0, 2, 10)...),   // epoch repeated
		image(es(0, 0)...),          // epoch 0
		append([]byte("TNRJRNL\x02"), rawEntry(1, 0)...),
		[]byte("not a journal at all"),
	} {
		f.Add(seed)
	}
	const path = "r1.journal"

	f.Fuzz(func(t *testing.T, data []byte) {
		mem := journaltest.NewMemFS()
		mem.WriteFile(path, data)
		readFile := func(t *testing.T, path string) []byte {
			b, err := mem.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}

		in, inspectErr := journal.InspectFS(mem, path)
		j, err := journal.OpenFS(mem, path)
		if err != nil {
			if !errors.Is(err, journal.ErrCorrupt) {
				t.Fatalf("Open = %v, want nil or ErrCorrupt", err)
			}
			if inspectErr == nil {
				t.Fatalf("Open = %v but Inspect accepted the file", err)
			}
			if got := readFile(t, path); !bytes.Equal(got, data) {
				t.Fatal("Open changed a file it refused")
			}
			return
		}
		defer j.Close()
		if inspectErr != nil {
			t.Fatalf("Open accepted a file Inspect refused: %v", inspectErr)
		}

		h := j.Entries()
		if err := checkRules(h); err != nil {
			t.Fatalf("Open loaded a history that breaks the rules: %v", err)
		}
		if !slices.Equal(h, in.Entries) {
			t.Fatalf("Open loaded %v, Inspect reported %v", h, in.Entries)
		}
		after := readFile(t, path)
		if len(after) > max(len(data), len(fileHeader)) {
			t.Fatalf("file grew from %d to %d bytes", len(data), len(after))
		}
		if len(data) >= len(fileHeader) && !bytes.HasPrefix(data, after) {
			t.Fatal("recovery rewrote bytes instead of only cutting the tail")
		}
		if !bytes.Equal(after, image(h...)) {
			t.Fatalf("after Open the file (%d bytes) is not exactly the loaded history (%d entries)", len(after), len(h))
		}

		// The recovered file takes an append at the boundary, and a reopen
		// reads it back.
		next := journal.EpochStart{Epoch: 1, Start: 0}
		if latest, ok := j.Latest(); ok {
			next = journal.EpochStart{Epoch: latest.Epoch + 1, Start: latest.Start}
		}
		want := h
		if len(h) < journal.MaxEntries && next.Epoch != 0 {
			if err := j.Record(next.Epoch, next.Start); err != nil {
				t.Fatalf("Record(%d, %d) after recovery = %v", next.Epoch, next.Start, err)
			}
			want = append(slices.Clone(h), next)
		}
		_ = j.Close()
		j2, err := journal.OpenFS(mem, path)
		if err != nil {
			t.Fatalf("reopen = %v", err)
		}
		defer j2.Close()
		if got := j2.Entries(); !slices.Equal(got, want) {
			t.Fatalf("reopen loaded %v, want %v", got, want)
		}
	})
}
