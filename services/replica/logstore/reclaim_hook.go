package logstore

// releaseStored is told, after the change is flushed to Badger, of every l/
// key whose stored value logstore removed: keys deleted (AdvanceLogStart
// below the log start, Truncate's cutLog at and above the cut, DropRange's
// deleteRangeKeys) and the key of a batch cutLog rewrote in place (its old
// value, usually a pointer into a segment, is no longer referenced; the
// rewritten batch is held inline in Badger). vals[i] is keys[i]'s old
// stored value (a pointer or an inline batch, see doc.go), copied: the
// callee may keep both.
//
// A no-op here: helper "reclaim" implements it (per-segment live
// accounting, segment deletion).
func (s *Store) releaseStored(keys, vals [][]byte) {}
