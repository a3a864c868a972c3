package logstore

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
)

// walEntry encodes one entry at pos following an entry with checksum prev.
func walEntry(gen uint64, pos int64, prev uint32, payload []byte) ([]byte, uint32) {
	b := make([]byte, walHeaderBytes, walHeaderBytes+len(payload))
	binary.BigEndian.PutUint64(b[0:8], gen)
	binary.BigEndian.PutUint32(b[8:12], uint32(len(payload)))
	b = append(b, payload...)
	crc := walCRC(prev, pos, b[0:12], payload)
	binary.BigEndian.PutUint32(b[12:16], crc)
	return b, crc
}

// An entry that checks out on its own but does not continue the pass's
// chain (bytes of an older pass, or a record value shaped like an entry)
// ends the replay, even with the right generation.
func TestWALEntriesFollowTheChain(t *testing.T) {
	kv := func(k, v string) []byte {
		b := binary.BigEndian.AppendUint32(nil, uint32(len(k)))
		b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
		return append(append(b, k...), v...)
	}
	a, crcA := walEntry(7, 0, 0, kv("l/x", "a"))
	pos := int64(len(a))
	forged, _ := walEntry(7, pos, 0, kv("s/x", "forged")) // unchained
	chained, _ := walEntry(7, pos, crcA, kv("l/x", "b"))

	for name, tc := range map[string]struct {
		file []byte
		want int
	}{
		"chained":     {append(append([]byte(nil), a...), chained...), 2},
		"forged":      {append(append([]byte(nil), a...), forged...), 1},
		"moved":       {append(append(append([]byte(nil), a...), 0), chained...), 1},
		"other pass":  {append(append([]byte(nil), a...), func() []byte { e, _ := walEntry(6, pos, crcA, kv("l/x", "c")); return e }()...), 1},
		"empty":       {nil, 0},
		"torn header": {append(append([]byte(nil), a...), chained[:10]...), 1},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "wal")
			if err := os.WriteFile(path, tc.file, 0o644); err != nil {
				t.Fatal(err)
			}
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			gen, entries, _, err := walEntries(f)
			if err != nil {
				t.Fatal(err)
			}
			if len(entries) != tc.want || (tc.want > 0 && gen != 7) {
				t.Fatalf("walEntries = gen %d, %d entries; want gen 7, %d entries", gen, len(entries), tc.want)
			}
		})
	}
}
