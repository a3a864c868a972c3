package logstore

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// ErrStoreLost: the directory holds a store's files but not Badger's
// MANIFEST, the file that lists Badger's tables. Badger would open such a
// directory as a new, empty database, and delete the tables its new
// manifest does not list: every range would come back empty (or not at
// all) on a disk that still claims to be the replica's, and a fence would
// count the emptied copy. Open refuses instead.
var ErrStoreLost = errors.New("logstore: store lost")

// manifestName is Badger's manifest file in badgerDir. Part of Badger's
// on-disk format (badger/v4 manifest.go).
const manifestName = "MANIFEST"

// checkNotLost returns ErrStoreLost when dir holds files only an opened
// store writes (the WAL, segments, journals, Badger's tables or value logs)
// while badger/MANIFEST is missing. Badger writes its MANIFEST when it
// first opens, before this package writes anything else, so a store that
// ever opened has one; a new directory, or one whose first Open stopped
// before Badger did, has neither. It must run before badger.Open, which
// would write a new MANIFEST and delete the evidence.
func checkNotLost(dir, badgerDir string) error {
	manifest := ManifestPath(dir)
	_, err := os.Stat(manifest)
	if err == nil {
		return nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		// An I/O error is not a verdict on the store: Badger's own open
		// reports it.
		return nil
	}
	var found []string
	for _, pattern := range []string{
		filepath.Join(dir, "wal.*"),
		filepath.Join(dir, "segments", "*.seg"),
		filepath.Join(dir, "journal", "*.journal"),
		filepath.Join(badgerDir, "*.sst"),
		filepath.Join(badgerDir, "*.vlog"),
	} {
		m, _ := filepath.Glob(pattern)
		for _, p := range m {
			rel, rerr := filepath.Rel(dir, p)
			if rerr != nil {
				rel = p
			}
			found = append(found, rel)
		}
	}
	if len(found) == 0 {
		return nil
	}
	if len(found) > 4 {
		found = append(found[:4], fmt.Sprintf("and %d more", len(found)-4))
	}
	return fmt.Errorf("%w: %s is missing, but %s holds a store's files (%s): Badger would open it empty and delete its tables, "+
		"so every range's log and state on this replica is gone or unreachable. Nothing was changed. "+
		"%s", ErrStoreLost, manifest, dir, strings.Join(found, ", "), LostStoreAdvice(dir))
}

// ManifestPath is Badger's MANIFEST in the store directory dir: a store
// that ever opened has one (checkNotLost).
func ManifestPath(dir string) string { return filepath.Join(dir, "badger", manifestName) }

// LostStoreAdvice is what to do with the store directory dir once its
// store is lost (missing, or in files only misplaced): the one answer every
// refusal of such a directory gives.
func LostStoreAdvice(dir string) string {
	return "If the files are only misplaced (a volume not mounted, a path changed), put them back and start again; " +
		"never restore an older copy (a replica whose log went back in time still counts as the member, without the records it acknowledged since). " +
		"Otherwise treat it as a replaced disk: " + replacedDiskSteps(dir)
}

// replacedDiskSteps are the steps for a data directory whose store cannot
// be used again.
func replacedDiskSteps(dir string) string {
	return "move " + dir + " aside (keep it for diagnosis), start the replica on an empty directory, " +
		"and run 'tenurectl range rebuild RANGE --replica ID' for each range it was a member of"
}

// badgerOpenHint is what to do when Badger fails to open the store in dir:
// its own errors ("manifest has checksum mismatch", "Opening file ...
// invalid argument") name neither the cause nor a way out. A directory
// another process holds (Badger's lock) is not damage: it gets no hint,
// Badger's message says so.
func badgerOpenHint(dir string, err error) string {
	if strings.Contains(err.Error(), "Cannot acquire directory lock") {
		return ""
	}
	return fmt.Sprintf(". Badger's files in %s are damaged or unreadable, so no range on this replica can be opened; nothing was changed. "+
		"If the disk reports errors (dmesg) or the files' owner or permissions changed, fix that and start again. "+
		"If the files are damaged, treat it as a replaced disk (never restore an older copy: a replica whose log went back in time still counts as the member, without the records it acknowledged since): %s",
		filepath.Join(dir, "badger"), replacedDiskSteps(dir))
}
