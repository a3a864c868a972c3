package replica

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/tenurelog/tenure/pkg/journal"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

// A replica's incarnation is its data directory's identity: 16 random bytes,
// written as 32 lowercase hex digits to DataDir/incarnation at the
// directory's first start and read back at every later one. A member of a
// range is (replica id, incarnation), not an id (Kafka's KIP-853): a disk
// that was replaced or wiped comes back under the same id with another
// incarnation, and must not answer a fence as if it were the member, whose
// log it no longer holds (its empty log would count as a complete one).

const (
	// incarnationFile is the file in the data directory that holds it.
	// Part of the on-disk format.
	incarnationFile = "incarnation"
	// incarnationBytes is its length in random bytes (128 bits: two
	// directories never draw the same one).
	incarnationBytes = 16
)

// validIncarnation reports whether s is 32 lowercase hex digits.
func validIncarnation(s string) bool {
	if len(s) != 2*incarnationBytes {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// readIncarnation returns the incarnation dataDir/incarnation holds, or ""
// when the directory has none yet. id is the replica's, for the message.
func readIncarnation(dataDir, id string) (string, error) {
	path := filepath.Join(dataDir, incarnationFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("replica: read %s: %w", path, err)
	}
	inc := strings.TrimSuffix(string(b), "\n")
	// Assert right after reading: a damaged id is refused, not
	// replaced, since a new one would silently make this replica a
	// stranger to every range it is a member of.
	if !validIncarnation(inc) {
		// Where the right value is: the membership records it for every
		// range this replica is a member of. Wiping the directory instead
		// throws away every copy it holds.
		return "", fmt.Errorf("replica: %s holds %q, not %d lowercase hex digits: damaged. Nothing was changed. "+
			"Restore it: the membership records it, as replica %s's incarnation in 'tenurectl range show RANGE --json' (replicas[].incarnation) for any range %s is a member of; "+
			"write those %d hex digits and a newline to the file and start again",
			path, b, 2*incarnationBytes, id, id, 2*incarnationBytes)
	}
	return inc, nil
}

// checkStoreKept refuses a directory that has an incarnation but no store:
// badger/MANIFEST, which Badger writes when it first opens, is missing.
// The incarnation is written only after the store's first Open
// (newIncarnation), so an incarnation without a store means the store was
// lost (deleted, a volume mounted without it, a partial restore), not that
// a first start stopped early. Opening would make a new, empty store, and
// the replica would answer fences under the identity of the data it no
// longer holds: the membership's incarnation check, which catches a wiped
// disk, would pass, and a promotion could count the empty copy toward a
// quorum and lose acknowledged records only it and the dead leader held.
func checkStoreKept(dataDir, inc string) error {
	manifest := logstore.ManifestPath(dataDir)
	_, err := os.Stat(manifest)
	if !errors.Is(err, fs.ErrNotExist) {
		// There, or an I/O error the store's own Open reports.
		return nil
	}
	return fmt.Errorf("replica: %s names this directory incarnation %s, but its store is gone (%s is missing): "+
		"starting would serve empty logs as that incarnation's, so it does not start. Nothing was changed. %s",
		filepath.Join(dataDir, incarnationFile), inc, manifest, logstore.LostStoreAdvice(dataDir))
}

// newIncarnation makes and durably writes dataDir's incarnation. It runs
// after the store's first Open and before the replica serves, so every
// answer carries the incarnation that a restart will read back, and a
// directory with an incarnation always had a store (checkStoreKept).
// hadStore says whether badger/ existed before that Open: a store written
// before incarnations existed gets one now, and ranges whose membership
// recorded none record this one at their next fence.
func newIncarnation(dataDir string, hadStore bool, log *slog.Logger) (string, error) {
	raw := make([]byte, incarnationBytes)
	if _, err := rand.Read(raw); err != nil {
		return "", fmt.Errorf("replica: draw an incarnation: %w", err)
	}
	inc := hex.EncodeToString(raw)
	if err := writeIncarnation(dataDir, inc); err != nil {
		return "", err
	}
	if hadStore {
		log.Warn("data directory holds a store but no incarnation (written before incarnations): made one", "incarnation", inc, "data_dir", dataDir)
	} else {
		log.Info("new data directory: made its incarnation", "incarnation", inc, "data_dir", dataDir)
	}
	return inc, nil
}

// writeIncarnation writes inc to dataDir/incarnation atomically and
// durably: a temporary file, fsynced, renamed over, then the directory
// fsynced (and its parent, if the directory was just made), so a power loss
// leaves either no file or the whole id, never a torn one.
func writeIncarnation(dataDir, inc string) error {
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return fmt.Errorf("replica: %w", err)
	}
	path := filepath.Join(dataDir, incarnationFile)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("replica: write incarnation: %w", err)
	}
	_, err = f.WriteString(inc + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("replica: write incarnation: %w", err)
	}
	for _, d := range []string{dataDir, filepath.Dir(dataDir)} {
		if err := (journal.OSFS{}).SyncDir(d); err != nil {
			return fmt.Errorf("replica: write incarnation: sync directory %s: %w", d, err)
		}
	}
	return nil
}

// Incarnation is the incarnation of the replica's data directory.
func (s *Replica) Incarnation() string { return s.incarnation }

// checkOwner refuses a data directory that belongs to another replica:
// a range it holds records this directory's incarnation under a member id
// other than id. That is two replicas' directories swapped, or a replica
// started on a neighbour's (--data-dir, a volume mounted on the wrong
// host). Started anyway, every fence would name the member's own
// incarnation, which this directory does not carry, so each range would
// be reported lost ("disk replaced or wiped") on both replicas, and the
// advice for that, a rebuild, would discard two intact copies. Quarantined
// ranges, whose state is unreadable, and members recorded without an
// incarnation (before incarnations existed) say nothing.
func checkOwner(store *logstore.Store, id, inc, dataDir string) error {
	ids := store.RangeIDs()
	slices.Sort(ids)
	for _, rangeID := range ids {
		r, ok := store.Range(rangeID)
		if !ok || r.Quarantined() != nil {
			continue
		}
		for _, m := range r.State().Replicas {
			if m.GetIncarnation() == inc && m.GetId() != id {
				return fmt.Errorf("replica: data directory %s belongs to replica %s, not %s: range %s records member %s with this directory's incarnation %s (%s). "+
					"Nothing was changed. Start %s on it (were two replicas' directories swapped?), and give %s its own data directory",
					dataDir, m.GetId(), id, rangeID, m.GetId(), inc, filepath.Join(dataDir, incarnationFile), m.GetId(), id)
			}
		}
	}
	return nil
}
