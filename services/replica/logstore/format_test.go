package logstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"strings"
	"testing"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// sealed is value stored as a record under key (prepare's batches hold
// such records, one per offset).
func sealed(key []byte, epoch uint64, flags byte, value []byte) []byte {
	buf := make([]byte, recordHeaderBytes+len(value))
	copy(buf[recordHeaderBytes:], value)
	sealRecord(buf, crc32.Checksum(value, castagnoli), key, epoch, flags)
	return buf
}

func TestRecordRoundTrip(t *testing.T) {
	key := logKey("r1", 42)
	for _, tc := range []struct {
		epoch uint64
		flags byte
		value []byte
	}{
		{1, 0, []byte("hello")},
		{7, flagEpochStart, nil},
		{1 << 40, 0, nil},
	} {
		epoch, flags, value, _, err := decodeRecord(key, sealed(key, tc.epoch, tc.flags, tc.value))
		if err != nil || epoch != tc.epoch || flags != tc.flags || !bytes.Equal(value, tc.value) {
			t.Errorf("decodeRecord(sealed(%d, %d, %q)) = %d, %d, %q, %v", tc.epoch, tc.flags, tc.value, epoch, flags, value, err)
		}
	}
}

func TestRecordDamageIsCorrupt(t *testing.T) {
	key := logKey("r1", 42)
	good := sealed(key, 3, 0, []byte("payload"))
	for i := range good {
		bad := bytes.Clone(good)
		bad[i] ^= 0x01
		if _, _, _, _, err := decodeRecord(key, bad); !errors.Is(err, ErrCorrupt) {
			t.Errorf("byte %d flipped: decodeRecord = %v, want ErrCorrupt", i, err)
		}
	}
	for name, tc := range map[string]struct {
		key, stored []byte
	}{
		"short":        {key, good[:recordHeaderBytes-1]},
		"other offset": {logKey("r1", 43), good},
		"other range":  {logKey("r2", 42), good},
		// Well-formed checksums over fields the writer never writes.
		"epoch 0":          {key, sealed(key, 0, 0, []byte("x"))},
		"unknown flag":     {key, sealed(key, 1, 0x80, nil)},
		"start with value": {key, sealed(key, 1, flagEpochStart, []byte("x"))},
	} {
		if _, _, _, _, err := decodeRecord(tc.key, tc.stored); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: decodeRecord = %v, want ErrCorrupt", name, err)
		}
	}
	_, _, _, _, err := decodeRecord(key, append(bytes.Clone(good[:len(good)-1]), good[len(good)-1]^1))
	if !strings.Contains(err.Error(), "l/r1/42") {
		t.Errorf("error %q does not name the record as l/r1/42", err)
	}
}

func TestU64RoundTripAndDamage(t *testing.T) {
	key := rangeKey(prefixHWM, "r1")
	b := encodeU64(key, 12345)
	if v, err := decodeU64(key, b); err != nil || v != 12345 {
		t.Fatalf("decodeU64(encodeU64(12345)) = %d, %v", v, err)
	}
	if _, err := decodeU64(rangeKey(prefixSynced, "r1"), b); !errors.Is(err, ErrCorrupt) {
		t.Errorf("decodeU64 under another key = %v, want ErrCorrupt", err)
	}
	if _, err := decodeU64(key, b[:len(b)-1]); !errors.Is(err, ErrCorrupt) {
		t.Errorf("decodeU64 of a short value = %v, want ErrCorrupt", err)
	}
}

func TestStateRoundTrip(t *testing.T) {
	key := rangeKey(prefixState, "r1")
	for _, st := range []State{
		{},
		{FencedEpoch: 9, Epoch: 9, Role: tenurev1.Role_ROLE_LEADER, LeaderID: "n1", LeaderAddress: "http://a:1",
			Replicas: []*tenurev1.Replica{{Id: "n1", Address: "http://a:1"}, {Id: "n2"}}},
		{FencedEpoch: 3, Role: tenurev1.Role_ROLE_FENCED},
	} {
		got, err := decodeState(key, encodeState(key, st))
		if err != nil || !statesEqual(got, st) {
			t.Errorf("decodeState(encodeState(%+v)) = %+v, %v", st, got, err)
		}
	}
	// Epoch above the fence, with a valid checksum, is refused on read.
	bad := encodeState(key, State{FencedEpoch: 1, Epoch: 2})
	if _, err := decodeState(key, bad); !errors.Is(err, ErrCorrupt) {
		t.Errorf("decodeState of Epoch > FencedEpoch = %v, want ErrCorrupt", err)
	}
}

func statesEqual(a, b State) bool {
	if a.FencedEpoch != b.FencedEpoch || a.Epoch != b.Epoch || a.Role != b.Role || a.LeaderID != b.LeaderID ||
		a.LeaderAddress != b.LeaderAddress || len(a.Replicas) != len(b.Replicas) || a.Generation != b.Generation {
		return false
	}
	for i := range a.Replicas {
		if a.Replicas[i].GetId() != b.Replicas[i].GetId() || a.Replicas[i].GetAddress() != b.Replicas[i].GetAddress() ||
			a.Replicas[i].GetIncarnation() != b.Replicas[i].GetIncarnation() || a.Replicas[i].GetLearner() != b.Replicas[i].GetLearner() {
			return false
		}
	}
	return true
}

// FuzzDecodeState: no input panics or allocates beyond its bounds, and
// anything accepted re-encodes to the same bytes.
func FuzzDecodeState(f *testing.F) {
	key := rangeKey(prefixState, "r1")
	f.Add(encodeState(key, State{FencedEpoch: 2, Epoch: 1, LeaderID: "n1", Replicas: []*tenurev1.Replica{{Id: "n1"}}}))
	f.Add(encodeStateV1(key, State{FencedEpoch: 2, Epoch: 1, LeaderID: "n1", Replicas: []*tenurev1.Replica{{Id: "n1"}}}))
	f.Add(encodeState(key, State{FencedEpoch: 2, Generation: 9, Replicas: []*tenurev1.Replica{{Id: "n1", Incarnation: "ab", Learner: true}}}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := decodeState(key, b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("decodeState error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		again := encodeState(key, st)
		if b[0] == stateVersionV1 {
			again = encodeStateV1(key, st)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("decodeState accepted %x, which re-encodes as %x", b, again)
		}
	})
}

// encodeStateV1 is the version 1 encoding, which stores written before
// generations and incarnations hold.
func encodeStateV1(key []byte, st State) []byte {
	b := []byte{stateVersionV1}
	b = binary.BigEndian.AppendUint64(b, st.FencedEpoch)
	b = binary.BigEndian.AppendUint64(b, st.Epoch)
	b = binary.BigEndian.AppendUint32(b, uint32(st.Role))
	b = appendStr(b, st.LeaderID)
	b = appendStr(b, st.LeaderAddress)
	b = append(b, byte(len(st.Replicas)))
	for _, r := range st.Replicas {
		b = appendStr(b, r.GetId())
		b = appendStr(b, r.GetAddress())
	}
	return binary.BigEndian.AppendUint32(b, checksum(key, b))
}

// A state written by the version before generations reads back whole, as
// generation 0 (unknown) with no incarnations: a replica upgraded in place
// keeps its fences.
func TestStateVersion1StillReads(t *testing.T) {
	key := rangeKey(prefixState, "r1")
	st := State{FencedEpoch: 7, Epoch: 7, Role: tenurev1.Role_ROLE_FOLLOWER, LeaderID: "n2", LeaderAddress: "http://b:2",
		Replicas: []*tenurev1.Replica{{Id: "n1", Address: "http://a:1"}, {Id: "n2", Address: "http://b:2"}}}
	got, err := decodeState(key, encodeStateV1(key, st))
	if err != nil || !statesEqual(got, st) || got.Generation != 0 {
		t.Fatalf("decodeState(version 1 of %+v) = %+v, %v; want it back at generation 0", st, got, err)
	}
	// Re-encoded, it is version 2 and keeps everything.
	st.Generation = 42
	st.Replicas[1].Incarnation, st.Replicas[1].Learner = "0123456789abcdef0123456789abcdef", true
	got, err = decodeState(key, encodeState(key, st))
	if err != nil || !statesEqual(got, st) || got.Generation != 42 {
		t.Fatalf("decodeState(encodeState(%+v)) = %+v, %v", st, got, err)
	}
}

// FuzzDecodeRecord: no input panics, and anything accepted re-seals to the
// same bytes.
func FuzzDecodeRecord(f *testing.F) {
	key := logKey("r1", 7)
	f.Add(sealed(key, 1, 0, []byte("v")))
	f.Add(sealed(key, 2, flagEpochStart, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		epoch, flags, value, _, err := decodeRecord(key, b)
		if err != nil {
			return
		}
		if again := sealed(key, epoch, flags, value); !bytes.Equal(again, b) {
			t.Fatalf("decodeRecord accepted %x, which re-seals as %x", b, again)
		}
	})
}
