package logstore

// SetWALSyncOnRing decides, with onRing, whether each WAL sync goes through
// the store's io_uring (where it has one); the returned function restores
// the decision to sched.Contended.
func SetWALSyncOnRing(onRing func() bool) (restore func()) {
	prev := walSyncOnRing
	walSyncOnRing = onRing
	return func() { walSyncOnRing = prev }
}

// WALHasRing reports whether s's WAL holds an io_uring to sync through.
func (s *Store) WALHasRing() bool { return s.wal.ring != nil }

// CloseWALRing closes s's WAL ring under it, as a ring that failed: every
// later call on it fails with uring.ErrRing.
func (s *Store) CloseWALRing() error { return s.wal.ring.Close() }
