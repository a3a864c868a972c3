package logstore

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"

	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// These constants are part of the on-disk format (see the package comment).
// A store written by one version of tenure must be read by the next: change
// them only with a new version and a migration.
const (
	// Key prefixes. Range ids never contain '/' (wire.ValidateRangeID), so
	// "l/r1/" can never be a prefix of "l/r10/...".
	prefixLog      = "l/" // l/<range>/<offset u64 BE> -> stored batch from offset (batch.go), or a pointer to it (segment.go)
	prefixState    = "s/" // s/<range> -> State
	prefixHWM      = "h/" // h/<range> -> high-water mark
	prefixSynced   = "d/" // d/<range> -> synced-end marker
	prefixIntent   = "t/" // t/<range> -> pending truncation target
	prefixDrop     = "x/" // x/<range> -> pending drop (u64 value 0)
	prefixLogStart = "b/" // b/<range> -> log start (absent: 0)

	// recordHeaderBytes precedes a record's value: epoch u64, flags u8, crc u32.
	recordHeaderBytes = 8 + 1 + 4
	// flagEpochStart marks the record a new leader writes first in its epoch.
	flagEpochStart byte = 1 << 0
	// flagProducer marks a record an idempotent producer appended: its
	// value is preceded by a producer header (producerHeaderBytes), and the
	// checksum covers that header as part of the value.
	flagProducer byte = 1 << 1
	// knownFlags are the flag bits this version writes; any other bit set is
	// damage or a newer format, refused rather than ignored.
	knownFlags = flagEpochStart | flagProducer
	// producerHeaderBytes is a producer record's header, before its value:
	// producer id [16]byte, producer epoch u32, sequence u64.
	producerHeaderBytes = 16 + 4 + 8

	// u64ValueBytes is the length of an h/, d/ or t/ value: u64 BE, crc u32.
	u64ValueBytes = 8 + 4

	// stateVersion is the first byte of an s/ value this version writes.
	// Version 2 added each replica's incarnation and learner flag and the
	// range's generation; version 1 values (written before) still read,
	// as generation 0 with no incarnations.
	stateVersion   = 2
	stateVersionV1 = 1
	// replicaLearner is the learner bit of a replica's flags byte (version
	// 2); any other bit set is refused.
	replicaLearner byte = 1 << 0
	// maxStateStringBytes bounds each string of a State (ids, addresses), so
	// a damaged length cannot make a decoder allocate, and one constant keeps
	// encoder and decoder agreeing.
	maxStateStringBytes = 1024
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// rangeKey is prefix+id, the key of a range's s/, h/, d/ or t/ value.
func rangeKey(prefix, id string) []byte { return []byte(prefix + id) }

// logPrefix is the prefix of every record key of range id.
func logPrefix(id string) []byte { return []byte(prefixLog + id + "/") }

// logKey is the key of the record of range id at offset. Big-endian offsets
// sort numerically, so Badger's key order is log order.
func logKey(id string, offset uint64) []byte {
	return binary.BigEndian.AppendUint64(logPrefix(id), offset)
}

// parseLogKey returns the offset in key, which must be prefix (a logPrefix)
// followed by exactly 8 bytes.
func parseLogKey(prefix, key []byte) (uint64, error) {
	if len(key) != len(prefix)+8 || string(key[:len(prefix)]) != string(prefix) {
		return 0, fmt.Errorf("%w: key %q is not a record key under %q", ErrCorrupt, key, prefix)
	}
	return binary.BigEndian.Uint64(key[len(prefix):]), nil
}

// isLogKey says whether key is a record key (of any range).
func isLogKey(key []byte) bool {
	return len(key) > len(prefixLog)+8 && string(key[:len(prefixLog)]) == prefixLog
}

// keyString renders a record key for messages, offset in decimal:
// "l/r1/42".
func keyString(key []byte) string {
	if isLogKey(key) {
		return fmt.Sprintf("%s%d", key[:len(key)-8], binary.BigEndian.Uint64(key[len(key)-8:]))
	}
	return fmt.Sprintf("%q", key)
}

// sealRecord writes epoch, flags and the checksum into buf's header. key is
// the record's key (range and offset), so a record found under any other key
// fails its checksum.
func sealRecord(buf []byte, valueCRC uint32, key []byte, epoch uint64, flags byte) {
	binary.BigEndian.PutUint64(buf[0:8], epoch)
	buf[8] = flags
	binary.BigEndian.PutUint32(buf[9:13], recordCRC(valueCRC, key, epoch, flags))
}

// recordCRC finishes a record checksum: CRC-32C over value, key, epoch (u64
// BE) and flags, in that order, continued from the value's checksum.
func recordCRC(valueCRC uint32, key []byte, epoch uint64, flags byte) uint32 {
	crc := crc32.Update(valueCRC, castagnoli, key)
	var tail [9]byte
	binary.BigEndian.PutUint64(tail[0:8], epoch)
	tail[8] = flags
	return crc32.Update(crc, castagnoli, tail[:])
}

// decodeRecord verifies a stored record read under key and returns its
// fields. value and prod's id alias stored. Every failure wraps ErrCorrupt:
// a checksum only says the bytes are the ones written, so the fields are
// asserted too.
func decodeRecord(key, stored []byte) (epoch uint64, flags byte, value []byte, prod Producer, err error) {
	if len(stored) < recordHeaderBytes {
		return 0, 0, nil, Producer{}, fmt.Errorf("%w: record %s is %d bytes, shorter than its %d-byte header", ErrCorrupt, keyString(key), len(stored), recordHeaderBytes)
	}
	epoch = binary.BigEndian.Uint64(stored[0:8])
	flags = stored[8]
	sum := binary.BigEndian.Uint32(stored[9:13])
	value = stored[recordHeaderBytes:]
	if got := recordCRC(crc32.Checksum(value, castagnoli), key, epoch, flags); got != sum {
		return 0, 0, nil, Producer{}, fmt.Errorf("%w: record %s fails its checksum (stored %08x, computed %08x)", ErrCorrupt, keyString(key), sum, got)
	}
	if flags&flagProducer != 0 {
		if len(value) < producerHeaderBytes {
			return 0, 0, nil, Producer{}, fmt.Errorf("%w: producer record %s holds %d bytes, shorter than its %d-byte producer header", ErrCorrupt, keyString(key), len(value), producerHeaderBytes)
		}
		prod, value = decodeProducer(value), value[producerHeaderBytes:]
	}
	if err := checkRecordFields(epoch, flags, len(value)); err != nil {
		return 0, 0, nil, Producer{}, fmt.Errorf("%w: record %s: %w", ErrCorrupt, keyString(key), err)
	}
	if flags&flagProducer != 0 && prod.ID == (ProducerID{}) {
		return 0, 0, nil, Producer{}, fmt.Errorf("%w: producer record %s names the all-zero producer id", ErrCorrupt, keyString(key))
	}
	return epoch, flags, value, prod, nil
}

// encodeProducer writes p's producer header into b (producerHeaderBytes).
func encodeProducer(b []byte, p Producer) {
	copy(b[0:16], p.ID[:])
	binary.BigEndian.PutUint32(b[16:20], p.Epoch)
	binary.BigEndian.PutUint64(b[20:28], p.Seq)
}

// decodeProducer reads a producer header from b (producerHeaderBytes).
func decodeProducer(b []byte) Producer {
	var p Producer
	copy(p.ID[:], b[0:16])
	p.Epoch = binary.BigEndian.Uint32(b[16:20])
	p.Seq = binary.BigEndian.Uint64(b[20:28])
	return p
}

// checkRecordFields is asserted before a record is written and after it is
// read: epoch 0 is "no grant yet" and never writes, an epoch-start record
// carries no data and no producer, and a value is at most
// wire.MaxRecordBytes.
func checkRecordFields(epoch uint64, flags byte, valueBytes int) error {
	switch {
	case epoch == 0:
		return fmt.Errorf("epoch 0")
	case flags&^knownFlags != 0:
		return fmt.Errorf("unknown flags %08b", flags)
	case flags&flagEpochStart != 0 && valueBytes != 0:
		return fmt.Errorf("epoch-start record carries %d value bytes", valueBytes)
	case flags&flagEpochStart != 0 && flags&flagProducer != 0:
		return fmt.Errorf("epoch-start record names a producer")
	case valueBytes > wire.MaxRecordBytes:
		return fmt.Errorf("value is %d bytes, at most %d", valueBytes, wire.MaxRecordBytes)
	}
	return nil
}

// encodeU64 is the value of an h/, d/ or t/ key: v, then CRC-32C over key
// and v.
func encodeU64(key []byte, v uint64) []byte {
	b := binary.BigEndian.AppendUint64(make([]byte, 0, u64ValueBytes), v)
	return binary.BigEndian.AppendUint32(b, checksum(key, b))
}

// decodeU64 verifies and decodes an encodeU64 value read under key.
func decodeU64(key, b []byte) (uint64, error) {
	if len(b) != u64ValueBytes {
		return 0, fmt.Errorf("%w: %q holds %d bytes, want %d", ErrCorrupt, key, len(b), u64ValueBytes)
	}
	if got, want := checksum(key, b[:8]), binary.BigEndian.Uint32(b[8:]); got != want {
		return 0, fmt.Errorf("%w: %q fails its checksum (stored %08x, computed %08x)", ErrCorrupt, key, want, got)
	}
	return binary.BigEndian.Uint64(b[:8]), nil
}

// checksum is CRC-32C over key then body.
func checksum(key, body []byte) uint32 {
	return crc32.Update(crc32.Checksum(key, castagnoli), castagnoli, body)
}

// checkState reports how st breaks the rules every stored State obeys.
func checkState(st State) error {
	// A replica acts under an epoch only after being fenced at it, so the
	// epoch it acts under can never be ahead of its fence.
	if st.Epoch > st.FencedEpoch {
		return fmt.Errorf("epoch %d is above fenced epoch %d", st.Epoch, st.FencedEpoch)
	}
	if _, ok := tenurev1.Role_name[int32(st.Role)]; !ok {
		return fmt.Errorf("unknown role %d", st.Role)
	}
	if len(st.Replicas) > wire.MaxReplicas {
		return fmt.Errorf("%d replicas, at most %d", len(st.Replicas), wire.MaxReplicas)
	}
	strs := []string{st.LeaderID, st.LeaderAddress}
	for i, r := range st.Replicas {
		if r == nil {
			return fmt.Errorf("replica %d is missing", i)
		}
		strs = append(strs, r.GetId(), r.GetAddress(), r.GetIncarnation())
	}
	for _, s := range strs {
		if len(s) > maxStateStringBytes {
			return fmt.Errorf("string of %d bytes, at most %d", len(s), maxStateStringBytes)
		}
	}
	return nil
}

// encodeState is the value of an s/ key:
//
//	version u8 (2) | fenced epoch u64 | epoch u64 | role u32 |
//	leader id str | leader address str | replica count u8 |
//	(id str, address str, incarnation str, flags u8)* | generation u64 |
//	CRC-32C u32 over key and everything before it
//
// where str is a u16 length and that many bytes, all integers big-endian,
// and flags bit 0 marks a learner. Version 1 (still read) has no
// incarnation, flags or generation. st must pass checkState.
func encodeState(key []byte, st State) []byte {
	b := []byte{stateVersion}
	b = binary.BigEndian.AppendUint64(b, st.FencedEpoch)
	b = binary.BigEndian.AppendUint64(b, st.Epoch)
	b = binary.BigEndian.AppendUint32(b, uint32(st.Role))
	b = appendStr(b, st.LeaderID)
	b = appendStr(b, st.LeaderAddress)
	b = append(b, byte(len(st.Replicas)))
	for _, r := range st.Replicas {
		b = appendStr(b, r.GetId())
		b = appendStr(b, r.GetAddress())
		b = appendStr(b, r.GetIncarnation())
		var flags byte
		if r.GetLearner() {
			flags |= replicaLearner
		}
		b = append(b, flags)
	}
	b = binary.BigEndian.AppendUint64(b, st.Generation)
	return binary.BigEndian.AppendUint32(b, checksum(key, b))
}

func appendStr(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// decodeState verifies and decodes an encodeState value read under key, of
// either version.
func decodeState(key, b []byte) (State, error) {
	fail := func(format string, args ...any) (State, error) {
		return State{}, fmt.Errorf("%w: state %q: %s", ErrCorrupt, key, fmt.Sprintf(format, args...))
	}
	if len(b) < 1+8+8+4+2+2+1+4 {
		return fail("%d bytes is too short", len(b))
	}
	body, sum := b[:len(b)-4], binary.BigEndian.Uint32(b[len(b)-4:])
	if got := checksum(key, body); got != sum {
		return fail("fails its checksum (stored %08x, computed %08x)", sum, got)
	}
	version := body[0]
	if version != stateVersion && version != stateVersionV1 {
		// A newer format is refused rather than guessed at.
		return fail("version %d, this build reads versions %d and %d", version, stateVersionV1, stateVersion)
	}
	d := decoder{b: body[1:]}
	var st State
	st.FencedEpoch = d.u64()
	st.Epoch = d.u64()
	st.Role = tenurev1.Role(d.u32())
	st.LeaderID = d.str()
	st.LeaderAddress = d.str()
	n := int(d.u8())
	for range n {
		if d.err != nil {
			break
		}
		r := &tenurev1.Replica{Id: d.str(), Address: d.str()}
		if version == stateVersion {
			r.Incarnation = d.str()
			flags := d.u8()
			if flags&^replicaLearner != 0 && d.err == nil {
				d.err = fmt.Errorf("replica %q has unknown flags %02x", r.Id, flags)
			}
			r.Learner = flags&replicaLearner != 0
		}
		st.Replicas = append(st.Replicas, r)
	}
	if version == stateVersion {
		st.Generation = d.u64()
	}
	if d.err != nil {
		return fail("%v", d.err)
	}
	if len(d.b) != 0 {
		return fail("%d trailing bytes", len(d.b))
	}
	// Assert right after reading: the checksum says these are the bytes
	// written, not that the writer obeyed the rules.
	if err := checkState(st); err != nil {
		return fail("%v", err)
	}
	return st, nil
}

// decoder reads big-endian fields, remembering the first overrun.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) take(n int) []byte {
	if d.err != nil || len(d.b) < n {
		if d.err == nil {
			d.err = fmt.Errorf("truncated: need %d bytes, %d left", n, len(d.b))
		}
		return make([]byte, n)
	}
	p := d.b[:n]
	d.b = d.b[n:]
	return p
}

func (d *decoder) u8() uint8   { return d.take(1)[0] }
func (d *decoder) u32() uint32 { return binary.BigEndian.Uint32(d.take(4)) }
func (d *decoder) u64() uint64 { return binary.BigEndian.Uint64(d.take(8)) }

func (d *decoder) str() string {
	n := int(binary.BigEndian.Uint16(d.take(2)))
	if n > maxStateStringBytes && d.err == nil {
		d.err = fmt.Errorf("string of %d bytes, at most %d", n, maxStateStringBytes)
	}
	if d.err != nil {
		return ""
	}
	return string(d.take(n))
}
