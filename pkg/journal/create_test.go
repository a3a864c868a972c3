package journal_test

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tenurelog/tenure/pkg/journal"
)

func TestCreate(t *testing.T) {
	for _, tt := range []struct {
		name    string
		initial []byte // nil: no file
	}{
		{"no journal", nil},
		{"replaces a journal", image(es(1, 0, 2, 50, 7, 90)...)},
		{"replaces a corrupt journal", []byte("TNRJRNL\x01 not entries, a corrupt middle")},
		{"replaces a torn journal", append(image(es(4, 0)...), 1, 2, 3)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "r1.journal")
			if tt.initial != nil {
				if err := os.WriteFile(path, tt.initial, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			rebuilt := es(1, 0, 3, 80, 5, 400)
			j, err := journal.Create(path, rebuilt)
			if err != nil {
				t.Fatalf("Create = %v", err)
			}
			wantEntries(t, j, rebuilt)
			mustRecord(t, j, es(6, 500)...)
			_ = j.Close()
			want := append(slices.Clone(rebuilt), es(6, 500)...)
			if got := readFile(t, path); !bytes.Equal(got, image(want...)) {
				t.Fatalf("file = %x, want %x", got, image(want...))
			}
			if names, _ := os.ReadDir(dir); len(names) != 1 {
				t.Fatalf("directory holds %v, want only the journal (no temp file left)", names)
			}
		})
	}
}

func TestCreateEmptyHistory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r1.journal")
	j, err := journal.Create(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	wantEntries(t, j, nil)
	if got := readFile(t, path); !bytes.Equal(got, fileHeader) {
		t.Fatalf("file = %q, want just the header", got)
	}
}

// Create asserts before writing: a history Open would refuse is never
// installed, and the journal already there is left alone.
func TestCreateRefusesInvalidHistory(t *testing.T) {
	tooLong := append(fullHistory(), journal.EpochStart{Epoch: journal.MaxEntries + 1, Start: 1 << 30})
	for _, tt := range []struct {
		name string
		h    []journal.EpochStart
	}{
		{"epoch 0", es(0, 0)},
		{"epoch repeated", es(1, 0, 1, 5)},
		{"epoch decreasing", es(3, 0, 2, 5)},
		{"start decreasing", es(1, 10, 2, 5)},
		{"more than MaxEntries", tooLong},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "r1.journal")
			old := image(es(1, 0)...)
			if err := os.WriteFile(path, old, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := journal.Create(path, tt.h)
			wantErrIs(t, "Create", err, journal.ErrInvalid)
			if got := readFile(t, path); !bytes.Equal(got, old) {
				t.Fatal("Create with an invalid history changed the existing journal")
			}
			if names, _ := os.ReadDir(dir); len(names) != 1 {
				t.Fatalf("directory holds %v, want only the journal", names)
			}
		})
	}
}

// Inspect reports what Open would find and do, and changes nothing.
func TestInspect(t *testing.T) {
	base := es(1, 0, 2, 300)
	badSum := image(append(slices.Clone(base), es(3, 400)...)...)
	badSum[len(badSum)-3] ^= 0x10
	tests := []struct {
		name    string
		data    []byte
		version byte
		repair  journal.Repair
		cut     int
		entries []journal.EpochStart
	}{
		{"clean", image(base...), 1, journal.RepairNone, 0, base},
		{"header only", fileHeader, 1, journal.RepairNone, 0, nil},
		{"torn", append(image(base...), rawEntry(3, 400)[:7]...), 1, journal.RepairTorn, 7, base},
		{"bad checksum", badSum, 1, journal.RepairChecksum, 20, base},
		{"empty file", nil, 0, journal.RepairHeader, 0, nil},
		{"header prefix", fileHeader[:3], 0, journal.RepairHeader, 0, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeJournal(t, tt.data)
			in, err := journal.Inspect(path)
			if err != nil {
				t.Fatalf("Inspect = %v", err)
			}
			want := journal.Inspection{Size: int64(len(tt.data)), Version: tt.version, Entries: tt.entries, Repair: tt.repair, CutBytes: tt.cut}
			if in.Size != want.Size || in.Version != want.Version || !slices.Equal(in.Entries, want.Entries) || in.Repair != want.Repair || in.CutBytes != want.CutBytes {
				t.Fatalf("Inspect = %+v, want %+v", in, want)
			}
			if got := readFile(t, path); !bytes.Equal(got, tt.data) {
				t.Fatal("Inspect changed the file")
			}
			// Open agrees with the inspection.
			j := mustOpen(t, path)
			wantEntries(t, j, tt.entries)
			wantSize := max(len(tt.data)-tt.cut, len(fileHeader))
			if got := len(readFile(t, path)); got != wantSize {
				t.Fatalf("after Open the file is %d bytes, want %d", got, wantSize)
			}
		})
	}
}

func TestInspectReportsWhereTheDamageIs(t *testing.T) {
	data := image(es(1, 0, 2, 300, 3, 400)...)
	data[8+20+5] ^= 0x01
	path := writeJournal(t, data)
	_, err := journal.Inspect(path)
	wantErrIs(t, "Inspect", err, journal.ErrCorrupt)
	for _, want := range []string{"journal: ", "entry 1", "byte 28", path} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Inspect error %q does not mention %q", err, want)
		}
	}
}

func TestInspectMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nope.journal")
	_, err := journal.Inspect(path)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Inspect(missing) = %v, want fs.ErrNotExist", err)
	}
	if _, statErr := os.Stat(path); !errors.Is(statErr, fs.ErrNotExist) {
		t.Fatal("Inspect created the missing file")
	}
}
