package journal

import (
	"fmt"
	"os"
	"path/filepath"
)

// Create writes a fresh journal holding entries at path, replacing any file
// there, and opens it. It is the way to install a history rebuilt from the
// log (every stored record carries its epoch) when the journal is missing or
// ErrCorrupt. No Journal may be open on path while it runs.
//
// The replacement is atomic: the journal is written to path+".tmp", fsynced,
// renamed over path and the directory fsynced. A crash leaves the old file
// or the new one, never a mix, and never a new name over unsynced bytes.
// entries must obey the history rules, or Create returns ErrInvalid and
// touches nothing.
func Create(path string, entries []EpochStart) (*Journal, error) {
	return CreateFS(OSFS{}, path, entries)
}

// CreateFS is Create in fsys.
func CreateFS(fsys FS, path string, entries []EpochStart) (*Journal, error) {
	// Assert before writing to disk: a history that Open would refuse must
	// not be installed in the first place.
	if err := checkHistory(entries); err != nil {
		return nil, fmt.Errorf("%w: Create(%s): %w", ErrInvalid, path, err)
	}
	img := make([]byte, 0, entryOffset(len(entries)))
	img = append(img, header[:]...)
	for _, e := range entries {
		img = appendEntry(img, e)
	}

	tmp := path + ".tmp"
	if err := writeSynced(fsys, tmp, img); err != nil {
		_ = fsys.Remove(tmp)
		return nil, err
	}
	if err := fsys.Rename(tmp, path); err != nil {
		_ = fsys.Remove(tmp)
		return nil, fmt.Errorf("journal: %w", err)
	}
	if err := fsys.SyncDir(filepath.Dir(path)); err != nil {
		return nil, fmt.Errorf("journal: sync directory of %s: %w", path, err)
	}
	// Reopen rather than trust the bytes just written: Open reads them back
	// and validates them like any other journal.
	return OpenFS(fsys, path)
}

// writeSynced writes img as the whole content of name and fsyncs it. The
// fsync comes before the rename: otherwise a crash can leave the new name
// pointing at a file whose bytes never reached the disk.
func writeSynced(fsys FS, name string, img []byte) error {
	f, err := fsys.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	if _, err := f.WriteAt(img, 0); err != nil {
		_ = f.Close()
		return fmt.Errorf("journal: write %s: %w", name, err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return fmt.Errorf("journal: sync %s: %w", name, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("journal: close %s: %w", name, err)
	}
	return nil
}

// Inspect reads the journal at path without changing it: what it holds and
// what Open would repair. It is for diagnosis (tenurectl journal dump); a
// replica uses Open. A file Open would refuse is ErrCorrupt here too.
func Inspect(path string) (Inspection, error) { return InspectFS(OSFS{}, path) }

// InspectFS is Inspect in fsys.
func InspectFS(fsys FS, path string) (Inspection, error) {
	f, err := fsys.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return Inspection{}, fmt.Errorf("journal: %w", err)
	}
	defer f.Close()
	return readImage(f, path)
}
