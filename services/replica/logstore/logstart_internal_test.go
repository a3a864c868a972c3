package logstore

// SetDeleteChunk makes AdvanceLogStart and Open delete the batches below
// the log start n keys per transaction, so a test can crash between two;
// the returned function restores the bound.
func SetDeleteChunk(n int) (restore func()) {
	old := deleteChunk
	deleteChunk = n
	return func() { deleteChunk = old }
}
