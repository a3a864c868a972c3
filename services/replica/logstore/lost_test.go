package logstore_test

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tenurelog/tenure/services/replica/logstore"
)

// TestOpenRefusesAStoreWithoutItsManifest removes Badger's MANIFEST (or the
// whole badger/ directory) from a closed store that holds ranges, the way a
// bad restore, a half-mounted volume or an operator's rm leaves it, and
// checks that Open refuses with ErrStoreLost, names the file, and leaves
// the directory as it was. Before, Badger opened it as a new database,
// deleted the tables its new manifest did not list, and the store came
// back with no ranges: a replica then answered its next fence with an empty
// log under its old identity, and 'tenurectl log dump' on the directory
// reported "holds no range" and destroyed the tables it was asked to show.
func TestOpenRefusesAStoreWithoutItsManifest(t *testing.T) {
	for name, damage := range map[string]func(dir string) error{
		"manifest removed": func(dir string) error { return os.Remove(filepath.Join(dir, "badger", "MANIFEST")) },
		"badger removed":   func(dir string) error { return os.RemoveAll(filepath.Join(dir, "badger")) },
	} {
		t.Run(name, func(t *testing.T) {
			o := closedThreeRanges(t)
			if err := damage(o.dir); err != nil {
				t.Fatal(err)
			}
			before := listFiles(t, o.dir)
			s, err := logstore.Open(o.dir, o.opts)
			if err == nil {
				ids := s.RangeIDs()
				_ = s.Close()
				t.Fatalf("Open = nil error (ranges %v), want ErrStoreLost", ids)
			}
			if !errors.Is(err, logstore.ErrStoreLost) {
				t.Fatalf("Open = %v, want ErrStoreLost", err)
			}
			for _, want := range []string{filepath.Join(o.dir, "badger", "MANIFEST"), "tenurectl range rebuild"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
			if after := listFiles(t, o.dir); strings.Join(after, "\n") != strings.Join(before, "\n") {
				t.Errorf("Open changed the directory:\nbefore %v\nafter  %v", before, after)
			}
		})
	}
}

// TestOpenNewDirectoryStillWorks: an empty directory, or one holding only
// an empty badger/ (what a first Open that stopped before Badger leaves),
// is a new store, not a lost one.
func TestOpenNewDirectoryStillWorks(t *testing.T) {
	o := newOpener(t)
	if err := os.MkdirAll(filepath.Join(o.dir, "badger"), 0o755); err != nil {
		t.Fatal(err)
	}
	s := o.open()
	mustRange(t, s, "r1")
	closeStore(t, s)
	s = o.open()
	defer closeStore(t, s)
	if _, ok := s.Range("r1"); !ok {
		t.Fatal("range r1 gone after a reopen")
	}
}

// listFiles lists every file under dir with its size.
func listFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if d.IsDir() {
			out = append(out, rel+"/")
		} else {
			out = append(out, rel+" "+strconv.FormatInt(info.Size(), 10))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestOpenDamagedBadgerSaysWhatToDo damages Badger's MANIFEST (a flipped
// byte) and truncates a table to zero bytes: Open fails, as it must, and
// the error says what to do. Before, it was Badger's own text alone
// ("manifest has checksum mismatch"; "Opening file: ... invalid
// argument"), which names no cause and no way out.
func TestOpenDamagedBadgerSaysWhatToDo(t *testing.T) {
	for name, damage := range map[string]func(t *testing.T, dir string){
		"manifest byte flipped": func(t *testing.T, dir string) {
			p := filepath.Join(dir, "badger", "MANIFEST")
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			b[len(b)-1] ^= 0xff
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
		},
		"table emptied": func(t *testing.T, dir string) {
			tables, _ := filepath.Glob(filepath.Join(dir, "badger", "*.sst"))
			if len(tables) == 0 {
				t.Fatal("no Badger table after closing the store (Close flushes the memtable): nothing to damage")
			}
			if err := os.Truncate(tables[0], 0); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			o := closedThreeRanges(t)
			damage(t, o.dir)
			s, err := logstore.Open(o.dir, o.opts)
			if err == nil {
				_ = s.Close()
				t.Fatal("Open of a damaged Badger = nil error")
			}
			for _, want := range []string{filepath.Join(o.dir, "badger"), "damaged or unreadable", "tenurectl range rebuild"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
		})
	}
}
