package logstore

import (
	"fmt"
	"io"
	"log/slog"
	"testing"
)

// Every truncation left an entry in intentClears (kept for PowerLoss until
// a sync covers the cleared intent), and nothing removed it: one per range
// id ever truncated, dropped ranges included, for the life of the store.
// Entries a finished sync covers are dropped now.
func TestIntentClearsKeepOnlyUnsyncedClears(t *testing.T) {
	s, err := Open(t.TempDir(), Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range 20 {
		id := fmt.Sprintf("t%d", i)
		r, err := s.CreateRange(id)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.RecordEpoch(1, 0); err != nil {
			t.Fatal(err)
		}
		// The epoch-start record, then a batch to cut.
		if _, err := r.Append(1, true, [][]byte{{}}); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Append(1, false, [][]byte{[]byte("a"), []byte("b"), []byte("c")}); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Truncate(1); err != nil {
			t.Fatalf("Truncate(1) on %s = %v", id, err)
		}
		if _, err := s.DropRange(id); err != nil {
			t.Fatalf("DropRange(%s) = %v", id, err)
		}
	}
	s.syncGate.Lock()
	n := len(s.intentClears)
	s.syncGate.Unlock()
	if n > 1 {
		t.Fatalf("%d cleared truncation intents kept after 20 truncated and dropped ranges, want at most the last one", n)
	}
}
