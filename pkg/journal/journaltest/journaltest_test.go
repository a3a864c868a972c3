package journaltest_test

import (
	"errors"
	"io/fs"
	"os"
	"testing"

	"github.com/tenurelog/tenure/pkg/journal/journaltest"
)

func readAll(t *testing.T, m *journaltest.MemFS, name string) string {
	t.Helper()
	b, err := m.ReadFile(name)
	if err != nil {
		t.Fatalf("ReadFile(%s) = %v", name, err)
	}
	return string(b)
}

// The crash model: a file's bytes survive as of its last Sync, a name as of
// its directory's last SyncDir.
func TestMemFSCrashKeepsOnlySyncedState(t *testing.T) {
	m := journaltest.NewMemFS()
	f, err := m.OpenFile("d/a", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("synced"), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Crash().ReadFile("d/a"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a created name survived a crash without SyncDir: %v", err)
	}
	if err := m.SyncDir("d"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte(" and not"), 6); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, m, "d/a"); got != "synced and not" {
		t.Fatalf("live content = %q", got)
	}
	if got := readAll(t, m.Crash(), "d/a"); got != "synced" {
		t.Fatalf("after a crash the file holds %q, want only the synced %q", got, "synced")
	}

	// A rename is durable only after SyncDir; until then the old name holds.
	if err := m.Rename("d/a", "d/b"); err != nil {
		t.Fatal(err)
	}
	c := m.Crash()
	if got := readAll(t, c, "d/a"); got != "synced" {
		t.Fatalf("before SyncDir, the old name holds %q", got)
	}
	if _, err := c.ReadFile("d/b"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the new name survived a crash before SyncDir: %v", err)
	}
	_ = m.SyncDir("d")
	c = m.Crash()
	if _, err := c.ReadFile("d/a"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the old name survived a synced rename: %v", err)
	}
	if got := readAll(t, c, "d/b"); got != "synced" {
		t.Fatalf("after a synced rename the new name holds %q", got)
	}

	// Truncation is like a write: durable only after Sync.
	if err := f.Truncate(2); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, m.Crash(), "d/b"); got != "synced" {
		t.Fatalf("an unsynced truncate survived a crash: %q", got)
	}
}

func TestMemFSAccessModes(t *testing.T) {
	m := journaltest.NewMemFS()
	m.WriteFile("a", []byte("abc"))
	if _, err := m.OpenFile("missing", os.O_RDONLY, 0); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("open missing = %v, want ErrNotExist", err)
	}
	if _, err := m.OpenFile("a", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("O_EXCL on an existing file = %v, want ErrExist", err)
	}
	r, err := m.OpenFile("a", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.WriteAt([]byte("x"), 0); !errors.Is(err, fs.ErrPermission) {
		t.Fatalf("write on a read-only file = %v, want ErrPermission", err)
	}
	_ = r.Close()
	if _, err := r.Stat(); !errors.Is(err, fs.ErrClosed) {
		t.Fatalf("Stat after Close = %v, want ErrClosed", err)
	}
	w, err := m.OpenFile("a", os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Sync(); err != nil {
		t.Fatalf("Sync on a write-only file = %v", err)
	}
	if got := readAll(t, m, "a"); got != "" {
		t.Fatalf("O_TRUNC left %q", got)
	}
}

func TestFaultFS(t *testing.T) {
	m := journaltest.NewMemFS()
	ffs := journaltest.NewFaultFS(m)
	f, err := ffs.OpenFile("a", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	ffs.SetInjector(journaltest.FailOp(journaltest.OpWrite, &journaltest.ShortWrite{N: 3}))
	if n, err := f.WriteAt([]byte("abcdef"), 0); n != 3 || err == nil {
		t.Fatalf("short write = %d, %v; want 3 and an error", n, err)
	}
	if got := readAll(t, m, "a"); got != "abc" {
		t.Fatalf("after a 3-byte short write the file holds %q", got)
	}

	ffs.SetInjector(journaltest.FailOp(journaltest.OpSync, journaltest.ErrInjected))
	if err := f.Sync(); !errors.Is(err, journaltest.ErrInjected) {
		t.Fatalf("injected Sync = %v", err)
	}
	if got := ffs.Syncs(); got != 0 {
		t.Fatalf("Syncs() = %d after only a failed sync, want 0", got)
	}
	ffs.SetInjector(nil)
	_ = f.Sync()
	_ = ffs.SyncDir(".")
	if got := ffs.Syncs(); got != 2 {
		t.Fatalf("Syncs() = %d, want 2", got)
	}

	ffs.SetInjector(journaltest.After(2))
	for i, wantErr := range []bool{false, false, true, true} {
		if err := f.Sync(); (err != nil) != wantErr {
			t.Fatalf("op %d under After(2) = %v, want failure %v", i, err, wantErr)
		}
	}
}
