package logstore

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// walPassOf writes file's bytes to a WAL file and reads its pass.
func walPassOf(t *testing.T, file []byte) walPass {
	t.Helper()
	path := filepath.Join(t.TempDir(), "wal")
	if err := os.WriteFile(path, file, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p, err := walEntries(f)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

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
			p := walPassOf(t, tc.file)
			gen, entries := p.gen, p.payloads
			if len(entries) != tc.want || (tc.want > 0 && gen != 7) {
				t.Fatalf("walEntries = gen %d, %d entries; want gen 7, %d entries", gen, len(entries), tc.want)
			}
		})
	}
}

// walPassBytes builds a pass of generation gen whose entry i records synced[i]
// as the pass's synced offset when it was written (-1: an entry written
// before entries recorded it), each holding one key. It returns the file's
// bytes and where each entry starts.
func walPassBytes(gen uint64, synced []int64) ([]byte, []int) {
	var file []byte
	var starts []int
	var prev uint32
	for i, s := range synced {
		var payload []byte
		if s >= 0 {
			payload = binary.BigEndian.AppendUint32(payload, uint32(len(walSyncedKey)))
			payload = binary.BigEndian.AppendUint32(payload, 16)
			payload = append(payload, walSyncedKey...)
			payload = binary.BigEndian.AppendUint64(payload, uint64(s))
			payload = binary.BigEndian.AppendUint64(payload, 0)
		}
		v := []byte{byte(i), 'v', 'a', 'l', 'u', 'e'}
		payload = binary.BigEndian.AppendUint32(payload, 3)
		payload = binary.BigEndian.AppendUint32(payload, uint32(len(v)))
		payload = append(append(payload, "l/x"...), v...)
		starts = append(starts, len(file))
		var e []byte
		e, prev = walEntry(gen, int64(len(file)), prev, payload)
		file = append(file, e...)
	}
	return file, starts
}

// Where a pass's readable entries stop, Open calls it damage only when a
// later entry of the same pass, chained to the stopped one, records a
// sync past it: a torn entry (never synced) and a damaged one no later
// entry witnesses both just end the pass.
func TestWALDamageIsWitnessedBySyncedEntries(t *testing.T) {
	// Entry i records the end of entry i-1 as synced: each was synced
	// before the next was written.
	_, starts := walPassBytes(7, []int64{0, 0, 0, 0})
	witnessed := []int64{0, int64(starts[1]), int64(starts[2]), int64(starts[3])}
	// Entries 1-3 written while nothing past entry 0 had been synced.
	unsynced := []int64{0, int64(starts[1]), int64(starts[1]), int64(starts[1])}
	staleTail := func() []byte {
		b, _ := walPassBytes(7, witnessed[:2])
		// An older pass beyond this one's end, at an entry boundary: the
		// entry after it chains, but is not of this pass's generation.
		old, _ := walPassBytes(5, []int64{0, 1 << 20, 1 << 20, 1 << 20})
		return append(b, old[len(b):]...)
	}
	flip := func(synced []int64, entry, at int) []byte {
		b, starts := walPassBytes(7, synced)
		b[starts[entry]+at] ^= 0x10
		return b
	}
	const payloadByte, crcByte, genByte = walHeaderBytes + 30, 13, 7
	for name, tc := range map[string]struct {
		file    []byte
		entries int
		damaged bool
	}{
		"payload flipped, synced":       {flip(witnessed, 1, payloadByte), 1, true},
		"checksum flipped, synced":      {flip(witnessed, 1, crcByte), 1, true},
		"generation flipped, synced":    {flip(witnessed, 2, genByte), 2, true},
		"first entry flipped, synced":   {flip(witnessed, 0, payloadByte), 0, true},
		"payload flipped, never synced": {flip(unsynced, 1, payloadByte), 1, false},
		"last entry flipped":            {flip(witnessed, 3, payloadByte), 3, false},
		"entries from before witnesses": {flip([]int64{-1, -1, -1, -1}, 1, walHeaderBytes+12), 1, false},
		"an older pass beyond the end":  {staleTail(), 2, false},
		"whole":                         {func() []byte { b, _ := walPassBytes(7, witnessed); return b }(), 4, false},
	} {
		t.Run(name, func(t *testing.T) {
			p := walPassOf(t, tc.file)
			if len(p.payloads) != tc.entries {
				t.Errorf("walEntries read %d entries, want %d", len(p.payloads), tc.entries)
			}
			if got := p.damage != nil; got != tc.damaged {
				t.Fatalf("walEntries damage = %v, want damaged %v", p.damage, tc.damaged)
			}
			if tc.damaged && (p.gen != 7 || !errors.Is(p.damage, ErrWALDamaged)) {
				t.Errorf("walEntries = gen %d, damage %v; want gen 7 and ErrWALDamaged", p.gen, p.damage)
			}
		})
	}
}

// The older of two replayed generations is damaged only when the newer one
// says both where it ended and that a sync covered it, and it reads
// shorter than that.
func TestOlderPassDamage(t *testing.T) {
	older := walPass{gen: 7, ends: []int64{100, 200}}
	for name, tc := range map[string]struct {
		old, newer walPass
		damaged    bool
	}{
		"whole":                      {older, walPass{gen: 8, prevEnd: 200, synced: 50}, false},
		"cut short":                  {walPass{gen: 7, ends: []int64{100}}, walPass{gen: 8, prevEnd: 200, synced: 50}, true},
		"unreadable from its start":  {walPass{}, walPass{gen: 8, prevEnd: 200, synced: 50}, true},
		"newer never synced":         {walPass{gen: 7, ends: []int64{100}}, walPass{gen: 8, prevEnd: 200}, false},
		"end unknown (after Open)":   {walPass{gen: 7, ends: []int64{100}}, walPass{gen: 8, synced: 50}, false},
		"another generation's bytes": {walPass{gen: 5, ends: []int64{300}}, walPass{gen: 8, prevEnd: 200, synced: 50}, true},
	} {
		t.Run(name, func(t *testing.T) {
			err := olderPassDamage("wal.0", 7, tc.old, tc.newer)
			if got := err != nil; got != tc.damaged || (err != nil && !errors.Is(err, ErrWALDamaged)) {
				t.Fatalf("olderPassDamage = %v, want damaged %v", err, tc.damaged)
			}
		})
	}
}
