package journal_test

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/tenurelog/tenure/pkg/journal"
	"github.com/tenurelog/tenure/pkg/journal/journaltest"
)

func TestOpenCreatesJournal(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r1.journal")
	j := mustOpen(t, path)
	wantEntries(t, j, nil)
	if got := readFile(t, path); !bytes.Equal(got, fileHeader) {
		t.Fatalf("new journal file = %q, want just the header %q", got, fileHeader)
	}
	mustRecord(t, j, es(1, 0, 2, 300)...)
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if got, want := readFile(t, path), image(es(1, 0, 2, 300)...); !bytes.Equal(got, want) {
		t.Fatalf("file after two records = %x, want %x", got, want)
	}
	wantEntries(t, mustOpen(t, path), es(1, 0, 2, 300))
}

// A crash while creating the journal leaves an empty file or a prefix of the
// header. No entry can have been written (entries follow a fsynced header),
// so Open writes the header rather than refusing the replica's journal.
func TestOpenWritesHeaderOfHeaderlessFile(t *testing.T) {
	for n := range len(fileHeader) {
		path := writeJournal(t, fileHeader[:n])
		j := mustOpen(t, path)
		wantEntries(t, j, nil)
		if got := readFile(t, path); !bytes.Equal(got, fileHeader) {
			t.Fatalf("%d-byte header prefix: file after Open = %q, want %q", n, got, fileHeader)
		}
		mustRecord(t, j, es(1, 0)...)
		_ = j.Close()
		wantEntries(t, mustOpen(t, path), es(1, 0))
	}
}

func TestOpenRefusesBadHeader(t *testing.T) {
	tests := []struct {
		name string
		data []byte
	}{
		{"wrong magic", append([]byte("TNRXRNL\x01"), rawEntry(1, 0)...)},
		{"unknown version", append([]byte("TNRJRNL\x02"), rawEntry(1, 0)...)},
		{"version 0", []byte("TNRJRNL\x00")},
		{"zeroed header", make([]byte, 8)},
		{"zeroed file", make([]byte, 8+20)},
		{"short non-journal", []byte("{}")},
		{"text file", []byte("hello, journal\n")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeJournal(t, tt.data)
			_, err := journal.Open(path)
			wantErrIs(t, "Open", err, journal.ErrCorrupt)
			if got := readFile(t, path); !bytes.Equal(got, tt.data) {
				t.Fatalf("Open changed a file it refused: %q, want %q", got, tt.data)
			}
		})
	}
}

// An interrupted append leaves a partial final entry, or a whole one whose
// bytes did not all reach the disk. Open must cut it from the FILE, not just
// from memory: a fragment left behind would put the next entry after it, and
// the reopen after that would read entries straddling boundaries.
func TestOpenCutsTornTailAtEveryOffset(t *testing.T) {
	base := es(1, 0, 2, 100, 3, 250)
	next := rawEntry(4, 400)
	badSum := slices.Clone(next)
	badSum[len(badSum)-1] ^= 0x01

	cases := map[string][]byte{"bad checksum": badSum}
	for cut := 1; cut < len(next); cut++ {
		cases[fmt.Sprintf("%d of 20 bytes", cut)] = next[:cut]
	}
	for name, tail := range cases {
		t.Run(name, func(t *testing.T) {
			path := writeJournal(t, append(image(base...), tail...))
			j := mustOpen(t, path)
			wantEntries(t, j, base)
			if got, want := readFile(t, path), image(base...); !bytes.Equal(got, want) {
				t.Fatalf("file after Open is %d bytes, want %d: the tail must be cut on disk", len(got), len(want))
			}
			mustRecord(t, j, es(4, 400)...)
			_ = j.Close()
			// The reopen is where a leftover fragment would show, as a
			// misaligned entry.
			want := append(slices.Clone(base), es(4, 400)...)
			wantEntries(t, mustOpen(t, path), want)
			if got := readFile(t, path); !bytes.Equal(got, image(want...)) {
				t.Fatalf("file after Record and reopen = %x, want %x", got, image(want...))
			}
		})
	}
}

func TestOpenCutsLastEntryWithAnyFlippedBit(t *testing.T) {
	base := es(1, 0, 2, 100)
	full := image(append(slices.Clone(base), es(3, 250)...)...)
	last := len(full) - 20
	for bit := range 20 * 8 {
		data := slices.Clone(full)
		data[last+bit/8] ^= 1 << (bit % 8)
		path := writeJournal(t, data)
		j := mustOpen(t, path)
		if got := j.Entries(); !slices.Equal(got, base) {
			t.Fatalf("bit %d of the last entry flipped: Entries() = %v, want %v", bit, got, base)
		}
		if got := readFile(t, path); !bytes.Equal(got, image(base...)) {
			t.Fatalf("bit %d of the last entry flipped: file not cut to %d bytes (is %d)", bit, len(image(base...)), len(got))
		}
	}
}

// Damage before the final entry cannot be an interrupted append, since each
// entry is fsynced before the next is written. It is refused, not skipped:
// skipping would load a history with a hole in it.
func TestOpenRefusesDamageBeforeLastEntry(t *testing.T) {
	full := image(es(1, 0, 2, 100, 3, 250, 4, 400)...)
	for _, entry := range []int{0, 1, 2} {
		for bit := range 20 * 8 {
			data := slices.Clone(full)
			data[8+entry*20+bit/8] ^= 1 << (bit % 8)
			path := writeJournal(t, data)
			_, err := journal.Open(path)
			if !errors.Is(err, journal.ErrCorrupt) {
				t.Fatalf("bit %d of entry %d flipped: Open = %v, want ErrCorrupt", bit, entry, err)
			}
			if got := readFile(t, path); !bytes.Equal(got, data) {
				t.Fatalf("bit %d of entry %d flipped: Open changed the file it refused", bit, entry)
			}
		}
	}
	// A bad final whole entry followed by a fragment is not the final thing
	// in the file either.
	data := image(es(1, 0, 2, 100)...)
	data[len(data)-1] ^= 0x80
	data = append(data, rawEntry(3, 250)[:7]...)
	_, err := journal.Open(writeJournal(t, data))
	wantErrIs(t, "Open(bad entry then fragment)", err, journal.ErrCorrupt)
}

// Checksums say the bytes are the ones written; they do not say the history
// is one this package would write. A non-advancing file is refused, also when
// the offending entry is the last (valid checksum, so not a torn append).
func TestOpenRefusesNonAdvancingHistory(t *testing.T) {
	tests := []struct {
		name string
		h    []journal.EpochStart
	}{
		{"epoch 0", es(0, 0)},
		{"epoch 0 after others", es(1, 0, 0, 10)},
		{"epoch repeated", es(1, 0, 1, 10)},
		{"epoch repeated at same start", es(1, 0, 1, 0)},
		{"epoch decreasing", es(2, 0, 1, 10)},
		{"start decreasing", es(1, 10, 2, 5)},
		{"middle entry bad", es(1, 0, 3, 100, 2, 200, 4, 300)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := journal.Open(writeJournal(t, image(tt.h...)))
			wantErrIs(t, "Open", err, journal.ErrCorrupt)
		})
	}
}

func fullHistory() []journal.EpochStart {
	h := make([]journal.EpochStart, journal.MaxEntries)
	for i := range h {
		h[i] = journal.EpochStart{Epoch: uint64(i + 1), Start: uint64(i) * 10}
	}
	return h
}

// MaxEntries is the wire bound, so the largest journal Open accepts is
// MaxEntries entries plus a torn fragment, and not one byte more.
func TestOpenSizeBound(t *testing.T) {
	full := image(fullHistory()...)

	path := writeJournal(t, append(slices.Clone(full), rawEntry(1<<40, 1<<40)[:19]...))
	j := mustOpen(t, path)
	if got := len(j.Entries()); got != journal.MaxEntries {
		t.Fatalf("len(Entries()) = %d, want %d", got, journal.MaxEntries)
	}
	err := j.Record(journal.MaxEntries+1, journal.MaxEntries*10)
	wantErrIs(t, "Record past MaxEntries", err, journal.ErrFull)
	if !strings.Contains(err.Error(), "limit") {
		t.Fatalf("Record past MaxEntries = %q, want a message that names the limit", err)
	}
	// Repeats and stale observations still succeed on a full journal.
	last := fullHistory()[journal.MaxEntries-1]
	mustRecord(t, j, last, journal.EpochStart{Epoch: 1, Start: 0})

	for _, extra := range []int{20, 21, 1000} {
		data := append(slices.Clone(full), make([]byte, extra)...)
		_, err := journal.Open(writeJournal(t, data))
		wantErrIs(t, "Open(oversized)", err, journal.ErrCorrupt)
		_, err = journal.Inspect(writeJournal(t, data))
		wantErrIs(t, "Inspect(oversized)", err, journal.ErrCorrupt)
	}
}

// hugeFile claims to be 1 TiB. Reading it fails the test: the size must be
// refused before anything is read or allocated for it.
type hugeFile struct {
	journal.File
	t *testing.T
}

type hugeInfo struct{ fs.FileInfo }

func (hugeInfo) Size() int64 { return 1 << 40 }

func (f hugeFile) Stat() (fs.FileInfo, error) {
	fi, err := f.File.Stat()
	return hugeInfo{fi}, err
}

func (f hugeFile) ReadAt([]byte, int64) (int, error) {
	f.t.Error("ReadAt called on a file whose size exceeds the bound")
	return 0, errors.New("unreachable")
}

func TestOpenChecksSizeBeforeReading(t *testing.T) {
	mem := journaltest.NewMemFS()
	mem.WriteFile("r1.journal", fileHeader)
	fsys := wrapFS{FS: mem, wrap: func(f journal.File) journal.File { return hugeFile{f, t} }}
	_, err := journal.OpenFS(fsys, "r1.journal")
	wantErrIs(t, "OpenFS(1 TiB file)", err, journal.ErrCorrupt)
	_, err = journal.InspectFS(fsys, "r1.journal")
	wantErrIs(t, "InspectFS(1 TiB file)", err, journal.ErrCorrupt)
}

// wrapFS wraps every file its FS opens.
type wrapFS struct {
	journal.FS
	wrap func(journal.File) journal.File
}

func (w wrapFS) OpenFile(name string, flag int, perm fs.FileMode) (journal.File, error) {
	f, err := w.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return w.wrap(f), nil
}

// A new journal's header and its directory entry are both durable when Open
// returns: after a crash the file is still there, header and all.
func TestOpenMakesNewJournalDurable(t *testing.T) {
	mem := journaltest.NewMemFS()
	j := mustOpenFS(t, mem, "data/r1.journal")
	_ = j.Close()
	got, err := mem.Crash().ReadFile("data/r1.journal")
	if err != nil {
		t.Fatalf("after a crash: %v; want the created journal to survive (file and directory fsync)", err)
	}
	if !bytes.Equal(got, fileHeader) {
		t.Fatalf("after a crash the journal holds %q, want the header %q", got, fileHeader)
	}
}

func TestOpenMakesCutDurable(t *testing.T) {
	mem := journaltest.NewMemFS()
	base := es(1, 0, 2, 100)
	mem.WriteFile("r1.journal", append(image(base...), rawEntry(3, 200)[:11]...))
	_ = mustOpenFS(t, mem, "r1.journal").Close()
	got, err := mem.Crash().ReadFile("r1.journal")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, image(base...)) {
		t.Fatalf("after Open and a crash the file is %d bytes, want %d: the cut must be fsynced", len(got), len(image(base...)))
	}
}

func TestOpenReportsIOErrors(t *testing.T) {
	for _, op := range []journaltest.Op{journaltest.OpOpen, journaltest.OpStat, journaltest.OpRead, journaltest.OpSyncDir} {
		mem := journaltest.NewMemFS()
		mem.WriteFile("r1.journal", image(es(1, 0)...))
		fsys := journaltest.NewFaultFS(mem)
		fsys.SetInjector(journaltest.FailOp(op, journaltest.ErrInjected))
		_, err := journal.OpenFS(fsys, "r1.journal")
		if !errors.Is(err, journaltest.ErrInjected) || !strings.HasPrefix(err.Error(), "journal: ") {
			t.Errorf("OpenFS with a failing %v = %v, want the injected error prefixed \"journal: \"", op, err)
		}
	}
}

// The journal must work when named by a bare relative path, whose parent
// directory is ".". The test runs in a child process so that it can set the
// working directory without changing this process's, which other tests share.
func TestOpenBareRelativePath(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperRelative$", "-test.count=1", "-test.v")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "JOURNAL_TEST_HELPER=relative")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestHelperRelative") {
		t.Fatalf("helper process: %v\n%s", err, out)
	}
	in, err := journal.Inspect(filepath.Join(dir, "r1.journal"))
	if err != nil {
		t.Fatal(err)
	}
	if want := es(1, 0, 2, 70); !slices.Equal(in.Entries, want) {
		t.Fatalf("journal written by the helper holds %v, want %v", in.Entries, want)
	}
}

// TestHelperRelative is TestOpenBareRelativePath's child process.
func TestHelperRelative(t *testing.T) {
	if os.Getenv("JOURNAL_TEST_HELPER") != "relative" {
		t.Skip("run by TestOpenBareRelativePath in a child process")
	}
	var (
		mu      sync.Mutex
		syncDir []string
	)
	fsys := journaltest.NewFaultFS(journal.OSFS{})
	fsys.SetInjector(func(op journaltest.Op, name string) error {
		if op == journaltest.OpSyncDir {
			mu.Lock()
			syncDir = append(syncDir, name)
			mu.Unlock()
		}
		return nil
	})
	j, err := journal.OpenFS(fsys, "r1.journal")
	if err != nil {
		t.Fatalf("OpenFS(\"r1.journal\") = %v", err)
	}
	mu.Lock()
	if !slices.Equal(syncDir, []string{"."}) {
		t.Errorf("directories fsynced = %q, want [\".\"]", syncDir)
	}
	mu.Unlock()
	mustRecord(t, j, es(1, 0, 2, 70)...)
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	wantEntries(t, mustOpen(t, "r1.journal"), es(1, 0, 2, 70))
	if _, err := os.Stat("r1.journal"); err != nil {
		t.Fatal(err)
	}
}
