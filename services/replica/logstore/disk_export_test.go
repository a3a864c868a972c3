package logstore

// ReadDiskNow takes a free-space reading at once (disk.go), as the
// monitor does every diskCheckInterval, so a test sees its FreeBytes seam
// acted on without waiting.
func (s *Store) ReadDiskNow() { s.readDisk() }

// SetSegmentWriteFault makes every segment write fail with what fault
// returns (nil: the write goes through); the returned function restores
// the writes.
func SetSegmentWriteFault(fault func(segment uint32) error) (restore func()) {
	segmentWriteHook.Store(&fault)
	return func() { segmentWriteHook.Store(nil) }
}
