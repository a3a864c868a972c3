package journal

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"

	"github.com/tenurelog/tenure/pkg/wire"
)

// These constants are part of the on-disk format (see the package comment).
// Changing any of them makes existing journals unreadable.
const (
	// magic opens every journal file.
	magic = "TNRJRNL"
	// version is the format version byte that follows magic.
	version = 0x01
	// HeaderBytes is the length of the file header: magic then version.
	HeaderBytes = len(magic) + 1
	// EntryBytes is the length of one entry: epoch u64, start u64, crc32c u32.
	EntryBytes = 8 + 8 + 4
)

// MaxEntries bounds a journal. It is the wire bound on purpose: a history
// this replica can recover locally must always be transmittable, or it would
// report "unknown" to every peer while its vector sat intact on disk.
const MaxEntries = wire.MaxEpochStarts

// maxFileBytes is the longest file Open accepts: a full journal plus a torn
// final entry, which an append interrupted at the bound cannot produce but
// costs nothing to tolerate. Anything longer is refused before a buffer is
// allocated for it, so a damaged or hostile file cannot exhaust memory at the
// moment the replica is trying to come back.
const maxFileBytes = int64(HeaderBytes + MaxEntries*EntryBytes + EntryBytes - 1)

// header is the exact 8-byte file header.
var header = [HeaderBytes]byte{'T', 'N', 'R', 'J', 'R', 'N', 'L', version}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// EpochStart is one entry of an epoch history: this replica's first record
// written under Epoch sits at offset Start.
type EpochStart struct {
	Epoch uint64
	Start uint64
}

// appendEntry appends e's 20-byte on-disk encoding to b.
func appendEntry(b []byte, e EpochStart) []byte {
	b = binary.BigEndian.AppendUint64(b, e.Epoch)
	b = binary.BigEndian.AppendUint64(b, e.Start)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b[len(b)-16:], castagnoli))
}

// decodeEntry decodes one 20-byte entry; ok is false when its checksum fails.
func decodeEntry(b []byte) (e EpochStart, ok bool) {
	_ = b[EntryBytes-1]
	sum := binary.BigEndian.Uint32(b[16:20])
	if crc32.Checksum(b[:16], castagnoli) != sum {
		return EpochStart{}, false
	}
	return EpochStart{Epoch: binary.BigEndian.Uint64(b[0:8]), Start: binary.BigEndian.Uint64(b[8:16])}, true
}

// entryOffset is the byte offset of entry i. Entries are fixed-size, so this
// is also the file length of a journal holding exactly i entries.
func entryOffset(i int) int64 { return int64(HeaderBytes) + int64(i)*EntryBytes }

// checkSize refuses a file length no valid journal can have.
func checkSize(size int64) error {
	if size < 0 || size > maxFileBytes {
		return fmt.Errorf("%w: %d bytes exceeds the largest journal (%d entries, %d bytes)", ErrCorrupt, size, MaxEntries, maxFileBytes)
	}
	return nil
}

// Repair is what Open does to a file before using it.
type Repair int

const (
	// RepairNone: the file is a whole journal.
	RepairNone Repair = iota
	// RepairHeader: the file is empty or holds a prefix of the header, which
	// is what a crash while creating it leaves. No entry can have been
	// written, since entries follow a fsynced header; Open writes the header.
	RepairHeader
	// RepairTorn: the file ends in a partial entry, an interrupted append.
	// Open cuts it off.
	RepairTorn
	// RepairChecksum: the final whole entry fails its checksum, an append
	// interrupted after its length reached the disk but before all its bytes
	// did. Open cuts it off.
	RepairChecksum
)

func (r Repair) String() string {
	switch r {
	case RepairNone:
		return "none"
	case RepairHeader:
		return "write header"
	case RepairTorn:
		return "cut torn final entry"
	case RepairChecksum:
		return "cut final entry with bad checksum"
	}
	return fmt.Sprintf("Repair(%d)", int(r))
}

// Inspection is what a journal file holds and what Open would do to it.
type Inspection struct {
	// Size is the file's length in bytes.
	Size int64
	// Version is the header's format version; 0 when the file holds no
	// complete header.
	Version byte
	// Entries is the history Open would load; nil when there is none.
	Entries []EpochStart
	// Repair is what Open would do to the file, and CutBytes how many bytes
	// it would remove from its end (RepairTorn, RepairChecksum).
	Repair   Repair
	CutBytes int
}

// scan decides what the journal image img (a whole file) holds and what
// recovery it needs. It is pure: Open and Inspect do the IO around it.
// A failure is always ErrCorrupt and says what is wrong and where.
func scan(img []byte) (Inspection, error) {
	if err := checkSize(int64(len(img))); err != nil {
		return Inspection{}, err
	}
	in := Inspection{Size: int64(len(img))}
	if len(img) < HeaderBytes {
		// A prefix of the header (including no bytes at all) is a crash
		// during creation; anything else in the first bytes is not ours.
		if !bytes.Equal(img, header[:len(img)]) {
			return Inspection{}, fmt.Errorf("%w: %d-byte file is not a journal header", ErrCorrupt, len(img))
		}
		in.Repair = RepairHeader
		return in, nil
	}
	if !bytes.Equal(img[:len(magic)], []byte(magic)) {
		return Inspection{}, fmt.Errorf("%w: bad magic %q, want %q", ErrCorrupt, img[:len(magic)], magic)
	}
	if v := img[len(magic)]; v != version {
		// A newer format is refused rather than guessed at.
		return Inspection{}, fmt.Errorf("%w: format version %d, this build reads version %d", ErrCorrupt, v, version)
	}
	in.Version = version

	body := img[HeaderBytes:]
	n, torn := len(body)/EntryBytes, len(body)%EntryBytes
	entries := make([]EpochStart, 0, n)
	for i := range n {
		e, ok := decodeEntry(body[i*EntryBytes:])
		if !ok {
			// Each entry is fsynced before the next is written, so only the
			// final thing in the file can be an interrupted append. A bad
			// entry with anything after it is damage, not a crash.
			if i == n-1 && torn == 0 {
				in.Repair, in.CutBytes = RepairChecksum, EntryBytes
				break
			}
			return Inspection{}, fmt.Errorf("%w: entry %d at byte %d fails its checksum", ErrCorrupt, i, entryOffset(i))
		}
		entries = append(entries, e)
	}
	if torn > 0 {
		in.Repair, in.CutBytes = RepairTorn, torn
	}
	// Assert right after reading: a checksum only says the bytes are the ones
	// written. The writer never writes a non-advancing entry, so one here is
	// a bug or damage, and loading it would hand promotion a false history.
	if err := checkHistory(entries); err != nil {
		return Inspection{}, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if len(entries) > 0 {
		in.Entries = entries
	}
	return in, nil
}
