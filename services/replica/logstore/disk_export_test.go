package logstore

// ReadDiskNow takes a free-space reading at once (disk.go), as the
// monitor does every diskCheckInterval, so a test sees its FreeBytes seam
// acted on without waiting.
func (s *Store) ReadDiskNow() { s.readDisk() }
