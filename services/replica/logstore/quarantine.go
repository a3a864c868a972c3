package logstore

import (
	"errors"
	"fmt"

	"github.com/tenurelog/tenure/pkg/journal"
)

// Quarantine: one range's damaged data never takes the whole store down.
//
// Open loads every range (loadRange). A range whose load fails because its
// own stored bytes fail their checks is loaded quarantined instead: Open
// succeeds, every other range opens and serves, and the quarantined one
// refuses every read and write with ErrQuarantined until DropRange deletes
// it (the replica service then hosts it afresh, empty, and it is rebuilt
// from its peers as a learner: tenurectl range rebuild). It is never served
// silently: its log end, HWM and history read as zero and empty, and every
// operation that would read or change its data refuses, so nothing of what
// Open could not verify reaches a reader, a follower or a promotion.
//
// What quarantines a range (quarantines): an error wrapping ErrCorrupt or
// journal.ErrCorrupt from its load, that is its state (s/), HWM (h/),
// synced-end marker (d/) or truncation intent (t/) failing its checksum or
// its field checks; the record just below the synced marker unreadable or
// missing (records below the marker were fsynced, so that is damage, not a
// torn tail); an epoch that decreases along the log; a journal that
// disagrees with the log in a way the log cannot settle (a rebuild that
// finds records missing or unreadable below the log end); a batch cut by a
// pending truncation that fails its checks.
//
// What still fails the store: everything else. Badger failing to open, the
// segments directory or the WAL failing to open or replay (they hold every
// range's writes: without them no range's recovery is known), and every
// I/O error during a range's load (a read that failed rather than read
// damaged bytes, a journal that cannot be written, a sync that failed):
// those are the disk or the process failing, not one range's bytes, and
// may be transient; quarantining on them would stop ranges whose data is
// fine, and the store could not make the rest of their recovery durable
// anyway. A damaged drop intent (x/) also still fails Open (redoDrops): it
// is read before any range is listed.
//
// Open verifies the state, the markers, the record below the synced
// marker and the journal's stretch ends, not every record (a log may hold
// months of them). Damage deeper in a log is found when it is read: Read
// and EpochAt answer ErrCorrupt for it, and the range is quarantined at the
// next Open only if that damage is where Open looks.

// quarantines reports whether err, from loading one range, is that range's
// own data failing its checks (quarantine the range) rather than the store
// or the disk failing (fail Open).
func quarantines(err error) bool {
	return errors.Is(err, ErrCorrupt) || errors.Is(err, journal.ErrCorrupt)
}

// quarantinedRange builds the quarantined Range of id, whose load failed
// with reason. Its state is kept if it still reads (the fence it records
// then still bounds a DropRange's epoch in the replica service); nothing
// else is kept. No journal is opened: nothing may append to or trust it.
func (s *Store) quarantinedRange(id string, reason error) *Range {
	r := newRange(s, id, nil)
	r.quarantined = reason
	stKey := rangeKey(prefixState, id)
	if b, ok, err := s.get(stKey); err == nil && ok {
		if st, err := decodeState(stKey, b); err == nil {
			r.state = st
		}
	}
	s.log.Error("range quarantined: its stored data fails its checks; it refuses every read and write until it is dropped and rebuilt from its peers (tenurectl range rebuild); the other ranges serve",
		"range", id, "reason", reason)
	return r
}

// Quarantined returns the quarantined ranges, by id, each with the reason
// its load failed. Empty when every range loaded.
func (s *Store) Quarantined() map[string]error {
	out := map[string]error{}
	for _, r := range s.snapshotRanges() {
		if r.quarantined != nil {
			out[r.id] = r.quarantined
		}
	}
	return out
}

// Quarantined returns why the range was quarantined at Open, or nil when it
// loaded and serves.
func (r *Range) Quarantined() error { return r.quarantined }

// usable refuses op on a quarantined range with an error wrapping
// ErrQuarantined that names the reason (as text: the refusal is not itself
// a corrupt read).
func (r *Range) usable(op string) error {
	if r.quarantined == nil {
		return nil
	}
	return fmt.Errorf("%w: %s on %s: %v", ErrQuarantined, op, r.id, r.quarantined)
}

// closeJournal closes the range's journal; a quarantined range has none.
func (r *Range) closeJournal() error {
	if r.j == nil {
		return nil
	}
	return r.j.Close()
}
