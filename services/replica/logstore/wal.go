package logstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dgraph-io/badger/v4"

	"github.com/tenurelog/tenure/internal/sched"
	"github.com/tenurelog/tenure/internal/uring"
	"github.com/tenurelog/tenure/pkg/journal"
)

// The write-ahead log.
//
// A group commit is durable once its batch is in the store's WAL and the WAL
// is fdatasynced, not once Badger's own files are synced. Badger writes its
// memtable WAL and value log through mappings of sparse files, so every
// sync of them is two fsyncs that each also commit file-system metadata
// (blocks allocated under the mapping, mtime), and a sync must first list
// the directory to find them. Three replicas on one disk then queue six
// metadata commits per acknowledged append. The WAL is one file written
// with pwrite, overwritten in place after its first pass, and synced with
// fdatasync: one data-only flush per group commit. Measured with the bench
// module's one-in-flight shape (3 replicas, 1 KiB records): the durability
// sync went from ~1.5 ms to ~0.7 ms at p50.
//
// Badger (with the segments its pointers locate, segment.go) is still
// where records live and are read from once indexed; it is written after
// the WAL, a few batches at a time (index.go), and never synced for a
// group commit. The WAL holds a copy of every batch written
// since the last checkpoint, and Open replays it into Badger before
// anything else reads the database.
//
// Two files, dir/wal.0 and dir/wal.1, alternate. Every entry carries the
// generation of the pass that wrote it. When the file being written passes
// walSwitchBytes, the writer switches to the other one under a new
// generation (overwriting it from offset 0) and a checkpoint runs in the
// background: it indexes every batch waiting (every entry of the old file
// joined unindexed before the switch), syncDB makes every Badger commit so
// far durable, which then covers every entry of the old file, and then the
// key w/gen (the oldest
// generation Open must replay) moves to the new generation. Open replays
// generation w/gen, then w/gen+1, each from its file's start up to the
// first entry that is torn, fails its checksum or belongs to another
// generation (a stale pass beyond the current one's end).
//
// Replaying an entry rewrites keys that may already hold its values, so a
// key that anything but the group commit changes must never have an entry
// in a generation that Open replays: Truncate forces a checkpoint before it
// cuts (forceCheckpoint), and Open and Close checkpoint around their own
// direct writes.
//
// Entry: gen u64 | payload length u32 | crc u32 | payload; payload: (key
// length u32 | value length u32 | key | value) per key, in the batch's write
// order, the first key being w/synced (walSyncedKey, since 2026-12-08) whose
// value (synced u64 | previous end u64) is where this file's pass was
// synced when the entry was written and, in a pass's first entry, where
// the pass before it (the other file's) ended. crc is crc32c over the previous entry's crc (0 for a pass's first
// entry), the entry's offset in the file, then the first 12 bytes and the
// payload (walCRC). Chained and placed: what lies beyond a pass's end is an
// older pass, whose bytes at an arbitrary offset may be record values a
// client chose; an entry there checks out only by matching a chain value
// that depends on everything this pass wrote before it.
//
// Damage is not a torn tail. A crash tears only what no completed
// fdatasync covered, and nothing of that was ever acknowledged, so the
// replay may end there. A byte that changed on the disk after its entry
// was synced (the disk's own damage) ends the replay the same way, and
// every acknowledged batch from there on would be lost without a word:
// fewer records than this replica acknowledged, on a copy that still
// counts as the member. So when the replay stops at an entry, Open looks
// at the entry right after it, where the stopped entry's length says: if
// that one checks out, chained to the stopped entry's stored checksum (its
// payload or generation changed) or to its recomputed one (its checksum
// changed), and it or an entry chained after it records a synced offset
// past the stopped entry (walSyncedKey), the stopped entry had been
// synced: Open fails with ErrWALDamaged (walPass.damage). A torn entry is
// never refused so: no completed sync covered it, so no entry records a
// synced offset past it. When two generations are replayed, the newer
// one's first entry records where the older one ended: once any entry of
// the newer one records a completed sync, the whole older pass was synced
// too (a sync covers every file written before it started), so an older
// pass that reads shorter is damaged (recoverWAL). What this cannot see:
// damage in the last synced entries of the newest pass (no later entry
// witnesses their sync), and a changed length field (it hides where the
// next entry starts).

// walSwitchBytes is the size at which the writer switches files: each file
// is overwritten in place from then on, and Open replays at most about two
// of them. Each switch checkpoints, and a checkpoint's syncDB writes back
// every value-log page dirtied since the last one, in one burst that WAL
// fdatasyncs queue behind on a shared disk. 16 MiB (a quarter second of
// appends at full speed here) keeps those bursts small, and a new store
// zeroes only 32 MiB of WAL on its first passes. Measured with the bench
// module's 256-in-flight shape, where the disk's write bandwidth is the
// limit (~450 MB/s written of the ~550 MB/s dd gets; 2x faster on tmpfs):
// 16 MiB against 64 MiB did 68.2k/69.4k/66.6k against 61.5k/63.4k/60.2k
// records/s over 3 s (interleaved), 62.0k/60.1k against 56.9k/58.0k over
// 10 s. A variable so tests can exercise switches with small batches.
var walSwitchBytes int64 = 16 << 20

const walHeaderBytes = 16

// walZeroAheadBytes is how far past an entry's end the file is extended
// with zeros when an entry would run past it. An fdatasync of a write that
// extends a file, or fills a hole, must also commit the file system's
// metadata (size, block allocation); one of a write over bytes already
// written need not. Measured here, three files fdatasynced in parallel,
// 1 KiB writes: p50 0.53 ms, p99 3-5.6 ms extending against 0.42 ms and
// 2.1-2.5 ms overwriting. Zeroing 256 KiB ahead leaves that cost to one
// sync in about 230 (1 KiB records) during a file's first pass, and to
// none once it has reached its switch size. A variable so tests can bound
// file sizes tightly.
var walZeroAheadBytes int64 = 256 << 10

// WALFixedBytes is what the two WAL files take on disk once the store has
// written through both: each file is switched from once it passes
// walSwitchBytes and is extended walZeroAheadBytes past its last entry, and
// both are overwritten in place from then on, never shrunk. Computed from
// the two variables (tests change them), so it is a function.
//
// It is the nominal size. A file runs past walSwitchBytes by the entry that
// crosses it (one group commit: a few hundred KiB under 256 appends of 1
// KiB in flight, at most maxQueueBytes), and by every entry written while
// the previous switch's checkpoint still runs (the writer does not switch
// again until it has finished): under load on a slow disk the files may
// grow past this, and keep that size.
func WALFixedBytes() int64 { return 2 * (walSwitchBytes + walZeroAheadBytes) }

// walZeros is a block of zeros for zeroAhead; never written to.
var walZeros = make([]byte, 64<<10)

// zeroAhead extends the file with zeros to walZeroAheadBytes past end when
// end is beyond its size. w.mu is held.
func (f *walFile) zeroAhead(end int64) error {
	if end <= f.size {
		return nil
	}
	to := end + walZeroAheadBytes
	for off := f.size; off < to; {
		n := min(int64(len(walZeros)), to-off)
		if _, err := f.f.WriteAt(walZeros[:n], off); err != nil {
			return fmt.Errorf("logstore: extend WAL: %w", err)
		}
		off += n
	}
	f.size = to
	return nil
}

// walKeepBufBytes bounds the encoding buffer kept between entries: a few
// full batches (wire.MaxBatchBytes) of the usual load.
const walKeepBufBytes = 16 << 20

// walGenKey holds the oldest WAL generation Open must replay.
var walGenKey = []byte("w/gen")

// walSyncedKey is the first key of every entry's payload. Its value is two
// u64s: the offset in the file up to which a completed fdatasync had
// covered the pass when the entry was written, and, in a pass's first
// entry, where the previous pass (in the other file) ended (0 elsewhere,
// and when unknown). Open reads them to tell a damaged synced entry from a
// torn unsynced one (walPass.damage, recoverWAL); the replay never writes
// the key to Badger. Entries written before it existed lack it, and
// witness nothing. (A version before it replays such an entry as one more
// key, w/synced, which nothing reads.)
var walSyncedKey = []byte("w/synced")

// ErrWALDamaged: an entry of a WAL generation Open must replay is
// unreadable although a later entry records that a completed fdatasync
// covered it. The batches from there on were durable, and may have been
// acknowledged, and cannot be replayed: opening would serve a copy with
// fewer records than it acknowledged. It wraps ErrCorrupt.
var ErrWALDamaged = fmt.Errorf("%w: WAL damaged", ErrCorrupt)

type walFile struct {
	f   *os.File
	gen uint64 // generation of the pass being written (or last written)
	pos int64  // where the next entry goes
	// prevCRC is the checksum of the entry before pos (0 at a pass's start).
	prevCRC uint32
	// synced is where the entries a completed fdatasync covered end (in
	// this pass); PowerLoss keeps no more of the file than that.
	// Invariant: synced <= pos, and only a sync taken in this pass (of
	// generation gen) raised it.
	synced int64
	// size is the file's length: every byte below it has been written
	// (entries or zeros), never a hole.
	size  int64
	dirty bool // written since its last fdatasync
}

type wal struct {
	mu    sync.Mutex
	cond  *sync.Cond // on mu; broadcast when a checkpoint ends
	files [2]*walFile
	cur   int // index of the file being written
	// checkpointing: a checkpoint of the other file is running; no switch
	// until it ends. switches counts switches, checkpointed how many of
	// them have completed their checkpoint (<= switches). wantSwitch asks
	// the running checkpoint to switch again when it ends (forceCheckpoint).
	checkpointing bool
	wantSwitch    bool
	switches      uint64
	checkpointed  uint64
	failed        error
	buf           []byte // encoding scratch, reused; guarded by mu
	// lostPower: PowerLoss cut the power; no sync completes after it.
	lostPower bool

	// syncMu serializes fdatasyncs, so a sync that returns covers every
	// write made before it was called (see sync).
	syncMu sync.Mutex
	// ring runs the fdatasyncs of a busy process, so that the syncing
	// goroutine does not hold a P meanwhile (package uring); nil where
	// io_uring is unavailable (an old kernel, or a seccomp profile that
	// refuses it), and every sync is then a plain fdatasync.
	ring *uring.Ring
	// noRing is why there is no ring (logged at Open).
	noRing error
}

var walTable = crc32.MakeTable(crc32.Castagnoli)

// walCRC is the checksum of the entry at pos whose header (first 12 bytes)
// and payload are given, following the entry whose checksum was prev.
func walCRC(prev uint32, pos int64, header, payload []byte) uint32 {
	var b [12]byte
	binary.BigEndian.PutUint32(b[0:4], prev)
	binary.BigEndian.PutUint64(b[4:12], uint64(pos))
	crc := crc32.Checksum(b[:], walTable)
	crc = crc32.Update(crc, walTable, header)
	return crc32.Update(crc, walTable, payload)
}

func walPath(dir string, i int) string { return filepath.Join(dir, fmt.Sprintf("wal.%d", i)) }

// openWAL opens (creating) the two WAL files in dir.
func openWAL(dir string) (*wal, error) {
	w := &wal{}
	w.cond = sync.NewCond(&w.mu)
	for i := range w.files {
		f, err := os.OpenFile(walPath(dir, i), os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			w.close()
			return nil, fmt.Errorf("logstore: open WAL: %w", err)
		}
		fi, err := f.Stat()
		if err != nil {
			_ = f.Close()
			w.close()
			return nil, fmt.Errorf("logstore: open WAL: %w", err)
		}
		w.files[i] = &walFile{f: f, size: fi.Size()}
	}
	w.ring, w.noRing = uring.New()
	// The files' directory entries must be durable before an entry in them
	// is counted as durable.
	if err := (journal.OSFS{}).SyncDir(dir); err != nil {
		w.close()
		return nil, fmt.Errorf("logstore: sync directory %s: %w", dir, err)
	}
	return w, nil
}

func (w *wal) close() {
	for _, f := range w.files {
		if f != nil {
			_ = f.f.Close()
		}
	}
	if w.ring != nil {
		_ = w.ring.Close()
	}
}

// walSyncOnRing says whether a WAL sync goes through the ring: only when
// goroutines wait for a P. Otherwise a plain fdatasync is cheaper: through
// the ring the caller parks, its thread goes idle and the completion has
// to wake one again, a few futex calls and context switches per sync
// (perf stat, one append in flight: 34,000 futex calls instead of 1,000
// in 3 s, and 60% more CPU per record). Sampled at the start of each sync,
// the scheduler was contended for 97% of the syncs at 100 ranges and for
// 40% with one append in flight. A variable so tests can send every sync
// there.
var walSyncOnRing = sched.Contended

// fdatasync syncs f's data: on the ring when goroutines wait for a P (the
// sync then frees the P of the goroutine waiting for it), otherwise with
// fdatasync(2), cheaper for a process with Ps to spare (walSyncOnRing).
// The same kernel call either way, with the same guarantee and errors.
func (w *wal) fdatasync(f *os.File) error {
	if w.ring != nil && walSyncOnRing() {
		err := w.ring.Fdatasync(int(f.Fd()))
		if !errors.Is(err, uring.ErrRing) {
			return err // the fdatasync's own outcome
		}
		// The ring failed, not the sync (which may not have run): sync
		// the plain way. The ring refuses every later call the same way.
	}
	return unix.Fdatasync(int(f.Fd()))
}

// walPass is one WAL file's current pass as Open reads it: the entries
// from the file's start while they are whole, check out and carry the
// first entry's generation.
type walPass struct {
	// gen is 0 when the file holds no valid entry (and no damaged first
	// entry with a valid one after it: then it is that entry's generation).
	gen      uint64
	payloads [][]byte
	ends     []int64 // ends[i] is where entry i ends in the file
	// synced is the greatest synced offset the readable entries record;
	// prevEnd where the first entry says the pass before it ended (0:
	// unknown, or no readable first entry).
	synced, prevEnd int64
	// damage is why the pass is known to go on past its readable entries
	// (ErrWALDamaged), nil when nothing says so.
	damage error
}

// walEntries reads one file's current pass, and looks past where its
// readable entries stop for a sign that they stop at damage rather than a
// torn tail (see "Damage is not a torn tail" above).
func walEntries(f *os.File) (walPass, error) {
	data, err := readAllFile(f)
	if err != nil {
		return walPass{}, err
	}
	var p walPass
	var prev uint32
	pos := 0
	for {
		g, payload, crc, ok := walEntryAt(data, pos, p.gen, prev)
		if !ok {
			break
		}
		prev, p.gen = crc, g
		synced, prevEnd := walEntryWitness(payload)
		p.synced = max(p.synced, synced)
		if len(p.payloads) == 0 {
			p.prevEnd = prevEnd
		}
		p.payloads = append(p.payloads, payload)
		pos += walHeaderBytes + len(payload)
		p.ends = append(p.ends, int64(pos))
	}
	if g, synced := walSyncedPast(data, pos, p.gen, prev); synced > int64(pos) {
		p.gen = g
		p.damage = fmt.Errorf("%w: %s (generation %d) is unreadable at offset %d, after %d readable entries, "+
			"yet an entry after it records that a completed fdatasync covered the file up to offset %d: "+
			"the batches from offset %d on were durable, and may have been acknowledged, and cannot be replayed",
			ErrWALDamaged, f.Name(), g, pos, len(p.payloads), synced, pos)
	}
	return p, nil
}

// olderPassDamage is why the pass of generation from, in the file named
// older, is damaged given newer, the pass of from+1 in the other file
// (ErrWALDamaged), or nil. Once an entry of newer records a completed sync,
// every entry of the older pass was synced too: a sync covers every file
// written before it started, and syncs run one at a time. So the older
// pass must read up to where newer's first entry says it ended; shorter
// (or unreadable from its start), it lost synced entries.
func olderPassDamage(older string, from uint64, old, newer walPass) error {
	if newer.prevEnd == 0 || newer.synced == 0 {
		return nil // nothing says how far the older pass went, or that it was synced
	}
	var end int64
	if old.gen == from && len(old.ends) > 0 {
		end = old.ends[len(old.ends)-1]
	}
	if end >= newer.prevEnd {
		return nil
	}
	return fmt.Errorf("%w: %s (generation %d) reads only up to offset %d, yet the next generation records that it ended at %d and that a completed fdatasync covered it: "+
		"the batches from offset %d on were durable, and may have been acknowledged, and cannot be replayed",
		ErrWALDamaged, older, from, end, newer.prevEnd, end)
}

// walEntryAt checks the entry at pos in data: whole, of generation gen
// (any but 0 when gen is 0), and chained to the entry whose checksum was
// prev. It returns the entry's generation, payload and checksum.
func walEntryAt(data []byte, pos int, gen uint64, prev uint32) (uint64, []byte, uint32, bool) {
	if len(data)-pos < walHeaderBytes {
		return 0, nil, 0, false
	}
	h := data[pos : pos+walHeaderBytes]
	g := binary.BigEndian.Uint64(h[0:8])
	n := int(binary.BigEndian.Uint32(h[8:12]))
	if g == 0 || (gen != 0 && g != gen) || n > len(data)-pos-walHeaderBytes {
		return 0, nil, 0, false // zeros, another pass, or torn
	}
	payload := data[pos+walHeaderBytes : pos+walHeaderBytes+n]
	crc := walCRC(prev, int64(pos), h[0:12], payload)
	if crc != binary.BigEndian.Uint32(h[12:16]) {
		return 0, nil, 0, false // torn, never written, not this pass's, or damaged
	}
	return g, payload, crc, true
}

// walSyncedPast looks past the entry at pos where a pass's readable
// entries stop (gen is the pass's generation, 0 if it has no readable
// entry; prev the checksum of the entry before pos). If the entry after it
// (where its length says) checks out, of the pass's generation and chained
// to the stopped entry's stored or recomputed checksum, it returns that
// generation and the greatest synced offset that entry, or one chained
// after it, records (walSyncedKey); otherwise 0, 0. The chain is what
// makes those entries this pass's, not an older pass's bytes or a record
// value shaped like an entry: generations are never reused.
func walSyncedPast(data []byte, pos int, gen uint64, prev uint32) (uint64, int64) {
	if len(data)-pos < walHeaderBytes {
		return 0, 0
	}
	h := data[pos : pos+walHeaderBytes]
	n := int(binary.BigEndian.Uint32(h[8:12]))
	if n > len(data)-pos-2*walHeaderBytes {
		return 0, 0 // no room for an entry after it
	}
	next := pos + walHeaderBytes + n
	stored := binary.BigEndian.Uint32(h[12:16])
	recomputed := walCRC(prev, int64(pos), h[0:12], data[pos+walHeaderBytes:next])
	for _, anchor := range []uint32{stored, recomputed} {
		g, payload, crc, ok := walEntryAt(data, next, gen, anchor)
		if !ok {
			continue
		}
		var synced int64
		for at := next; ok; {
			w, _ := walEntryWitness(payload)
			synced = max(synced, w)
			at += walHeaderBytes + len(payload)
			_, payload, crc, ok = walEntryAt(data, at, g, crc)
		}
		return g, synced
	}
	return 0, 0
}

// walEntryWitness is what an entry's payload records under walSyncedKey:
// the pass's synced offset, and where the previous pass ended; 0, 0 for an
// entry written before entries recorded them.
func walEntryWitness(payload []byte) (synced, prevEnd int64) {
	_ = walKVs(payload, func(k, v []byte) error {
		if string(k) == string(walSyncedKey) && len(v) == 16 {
			synced = int64(binary.BigEndian.Uint64(v[0:8]))
			prevEnd = int64(binary.BigEndian.Uint64(v[8:16]))
		}
		return errStopKVs // the key is first, if it is there at all
	})
	return synced, prevEnd
}

// errStopKVs ends a walKVs walk early.
var errStopKVs = errors.New("stop")

func readAllFile(f *os.File) ([]byte, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("logstore: read WAL: %w", err)
	}
	data := make([]byte, fi.Size())
	if _, err := f.ReadAt(data, 0); err != nil {
		return nil, fmt.Errorf("logstore: read WAL %s: %w", f.Name(), err)
	}
	return data, nil
}

// recoverWAL replays the WAL into Badger at Open, makes the result durable
// and starts a new generation (nothing replayed is replayed again), before
// any range is loaded: recovery then sees every batch the WAL made durable,
// whatever Badger's own unsynced files lost.
func (s *Store) recoverWAL(dir string) error {
	w, err := openWAL(dir)
	if err != nil {
		return err
	}
	s.wal = w
	if w.noRing != nil {
		// Not a fault: the syncs are fdatasync(2) calls, as they always
		// were; a busy process only loses the ring's gain (package uring).
		s.log.Info("WAL syncs use fdatasync(2) only: no io_uring here", "reason", w.noRing)
	}
	from, _, err := s.getU64Key(walGenKey)
	if err != nil {
		return err
	}
	var gens [2]uint64
	var entries [2][][]byte
	var passes [2]walPass
	for i, f := range w.files {
		if passes[i], err = walEntries(f.f); err != nil {
			return err
		}
	}
	for i, p := range passes {
		if p.gen == from+1 && p.damage == nil {
			p.damage = olderPassDamage(w.files[1-i].f.Name(), from, passes[1-i], p)
		}
		if p.damage != nil && (p.gen == from || p.gen == from+1) {
			// A generation the replay needs stops early at an entry that
			// was synced: what it held was durable and is gone. Nothing
			// was replayed or changed yet.
			return fmt.Errorf("%w. Nothing was changed. Treat it as a replaced disk: %s", p.damage, replacedDiskSteps(dir))
		}
		gens[i], entries[i] = p.gen, p.payloads
	}
	// Generation from first, then from+1: the checkpoint of from had not
	// ended (or from+1 was being written). Anything older was checkpointed.
	// An empty from does not end the replay: a switch right after an Open
	// (a Truncate's forceCheckpoint) or at the end of a checkpoint that
	// nothing was appended during leaves from without entries while from+1
	// holds durable ones. A file holding from+1 was written after w/gen
	// reached from (generations only grow, and Open starts above every one
	// it saw), so it is never a stale pass.
	replayed, top := 0, from
	for g := from; g <= from+1 && g > 0; g++ {
		i := -1
		for k := range gens {
			if gens[k] == g && len(entries[k]) > 0 {
				i = k
			}
		}
		if i < 0 {
			continue
		}
		for _, p := range entries[i] {
			if err := s.applyWALEntry(p); err != nil {
				return fmt.Errorf("logstore: replay WAL generation %d: %w", g, err)
			}
			replayed++
		}
		top = g
	}
	// Every generation seen so far is now below the new one, so a stale
	// pass is never taken for the current one. What was replayed is
	// replayed no more: the batches it wrote to segments must be on disk
	// first (segment.go).
	next := max(top, gens[0], gens[1], from) + 1
	if err := s.segs.sync(); err != nil {
		return err
	}
	if err := s.putU64Synced(walGenKey, next); err != nil {
		return err
	}
	w.files[0].gen, w.files[1].gen = next, next-1
	w.cur = 0
	if replayed > 0 {
		s.log.Info("replayed the write-ahead log", "entries", replayed, "from_generation", from)
	}
	return nil
}

// applyWALEntry writes one replayed batch to Badger, in its order.
func (s *Store) applyWALEntry(p []byte) error {
	var keys, vals [][]byte
	err := walKVs(p, func(k, v []byte) error {
		if string(k) == string(walSyncedKey) {
			return nil // the WAL's own bookkeeping, not a key of the batch
		}
		// Copies: Badger keeps references until the commit.
		keys, vals = append(keys, append([]byte(nil), k...)), append(vals, append([]byte(nil), v...))
		return nil
	})
	if err != nil {
		return err
	}
	// Batches to the segments, as the indexer writes them (index.go).
	if err := s.toSegments(keys, vals); err != nil {
		return err
	}
	tw := s.newTxnWriter()
	defer tw.discard()
	for i := range keys {
		if err := tw.set(keys[i], vals[i]); err != nil {
			return err
		}
	}
	return tw.commit()
}

// walKVs calls fn with each key and value of an entry's payload, in order.
func walKVs(p []byte, fn func(k, v []byte) error) error {
	for len(p) > 0 {
		if len(p) < 8 {
			return fmt.Errorf("%w: WAL entry ends inside a key header", ErrCorrupt)
		}
		kl, vl := int(binary.BigEndian.Uint32(p[0:4])), int(binary.BigEndian.Uint32(p[4:8]))
		p = p[8:]
		if kl == 0 || kl+vl > len(p) {
			return fmt.Errorf("%w: WAL entry holds a key of %d and a value of %d bytes in %d", ErrCorrupt, kl, vl, len(p))
		}
		if err := fn(p[:kl], p[kl:kl+vl]); err != nil {
			return err
		}
		p = p[kl+vl:]
	}
	return nil
}

// appendWAL writes ib's keys as one WAL entry and queues ib for the index
// (index.go) in the same critical section; the next sync makes the entry
// durable. The caller holds the writer role. Switches files when the
// current one is full and no checkpoint is running.
func (s *Store) appendWAL(ib *indexBatch) error {
	keys, vals := ib.keys, ib.vals
	w := s.wal
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.failed != nil {
		return w.failed
	}
	if w.files[w.cur].pos >= walSwitchBytes && !w.checkpointing {
		s.switchLocked()
	}
	f := w.files[w.cur]
	n := 8 + len(walSyncedKey) + 16
	for i := range keys {
		n += 8 + len(keys[i]) + len(vals[i])
	}
	if cap(w.buf) < walHeaderBytes+n {
		w.buf = make([]byte, 0, walHeaderBytes+n)
	}
	buf := w.buf[:walHeaderBytes]
	// First, how far a completed sync has covered this pass: what tells a
	// damaged synced entry before this one from a torn one at Open.
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(walSyncedKey)))
	buf = binary.BigEndian.AppendUint32(buf, 16)
	buf = append(buf, walSyncedKey...)
	buf = binary.BigEndian.AppendUint64(buf, uint64(f.synced))
	// And, first in a pass, where the pass before it (the other file's,
	// untouched since the switch) ended: the older of two generations Open
	// replays is checked against it (olderPassDamage). 0 after an Open,
	// where the other file holds no pass of the generation before.
	var prevEnd int64
	if f.pos == 0 {
		prevEnd = w.files[1-w.cur].pos
	}
	buf = binary.BigEndian.AppendUint64(buf, uint64(prevEnd))
	for i := range keys {
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(keys[i])))
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(vals[i])))
		buf = append(buf, keys[i]...)
		buf = append(buf, vals[i]...)
	}
	binary.BigEndian.PutUint64(buf[0:8], f.gen)
	binary.BigEndian.PutUint32(buf[8:12], uint32(n))
	crc := walCRC(f.prevCRC, f.pos, buf[0:12], buf[walHeaderBytes:])
	binary.BigEndian.PutUint32(buf[12:16], crc)
	if fault := s.walWriteFault; fault != nil {
		if err := fault(); err != nil {
			w.failed = fmt.Errorf("logstore: write WAL: %w", err)
			return w.failed
		}
	}
	if err := f.zeroAhead(f.pos + int64(len(buf))); err != nil {
		w.failed = err
		return w.failed
	}
	if _, err := f.f.WriteAt(buf, f.pos); err != nil {
		w.failed = fmt.Errorf("logstore: write WAL: %w", err)
		return w.failed
	}
	f.pos += int64(len(buf))
	f.prevCRC = crc
	f.dirty = true
	// Under w.mu: a switch after this sees the entry queued for the index,
	// so the checkpoint of this file indexes it before syncing Badger.
	s.addUnindexed(ib)
	// Keep the scratch buffer for the next entry unless a burst grew it
	// large: the queue admits up to maxQueueBytes in one batch.
	w.buf = buf[:0]
	if cap(buf) > walKeepBufBytes {
		w.buf = nil
	}
	return nil
}

// switchLocked starts the next generation in the other file and
// checkpoints the one just left, in the background. w.mu is held and no
// checkpoint is running.
func (s *Store) switchLocked() {
	w := s.wal
	old := w.files[w.cur]
	w.cur = 1 - w.cur
	next := w.files[w.cur]
	// The other file's pass was checkpointed (checkpointing is clear), so
	// overwriting it loses nothing.
	next.gen, next.pos, next.prevCRC, next.synced = old.gen+1, 0, 0, 0
	w.checkpointing = true
	w.switches++
	s.bg.Go(func() { s.checkpoint(next.gen) })
}

// checkpoint makes every entry of generation gen-1 redundant: it indexes
// every batch waiting (each entry of the old file joined unindexed before
// the switch), then syncDB makes every Badger commit so far durable. Then
// Open need not replay from before gen.
func (s *Store) checkpoint(gen uint64) {
	err := s.crash(CrashWALCheckpoint)
	if err == nil {
		err = s.indexPendingRetrying()
	}
	if err == nil {
		// The batches the old generation's pointers point to, before the
		// pointers themselves and before w/gen moves (segment.go).
		err = s.segs.sync()
	}
	if err == nil {
		err = s.syncDB()
	}
	if err == nil {
		// A failed store writes nothing more, and may have dropped batches
		// its indexer took (indexPending): Open must still replay them.
		err = s.writeErrAfterClose()
	}
	if err == nil {
		err = s.putU64Synced(walGenKey, gen)
	}
	w := s.wal
	w.mu.Lock()
	w.checkpointing = false
	if err != nil {
		w.failed = err
	} else {
		w.checkpointed++
		if w.wantSwitch {
			w.wantSwitch = false
			s.switchLocked()
		}
	}
	w.cond.Broadcast()
	w.mu.Unlock()
	if err != nil {
		_ = s.fail(err)
	}
}

// indexPendingRetrying is indexPending for a checkpoint: while the
// segments refuse writes for want of space it waits and tries again, since
// w/gen must not move past batches not yet in Badger, and failing the
// store would lose nothing but availability. Until the store closes: then
// the want of space is the checkpoint's failure, and the next Open
// replays the WAL.
func (s *Store) indexPendingRetrying() error {
	for {
		err := s.indexPending()
		if !errors.Is(err, ErrDiskFull) {
			return err
		}
		s.qmu.Lock()
		closing := s.closing
		s.qmu.Unlock()
		if closing {
			return err
		}
		time.Sleep(indexRetryDelay)
	}
}

// forceCheckpoint returns once a checkpoint that switched files after the
// call has ended: nothing written to the WAL before the call is replayed
// by Open any more. Concurrent callers share checkpoints.
func (s *Store) forceCheckpoint() error {
	w := s.wal
	w.mu.Lock()
	defer w.mu.Unlock()
	// The switch this call needs is the next one, numbered switches+1:
	// either made here, or, while the checkpoint of switch number switches
	// runs (that switch was before this call), made when it ends.
	target := w.switches + 1
	if w.checkpointing {
		w.wantSwitch = true
	} else {
		s.switchLocked()
	}
	for w.checkpointed < target && w.failed == nil {
		w.cond.Wait()
	}
	return w.failed
}

// syncWAL makes every WAL entry appended before the call durable: one
// fdatasync of each file written since its last sync. Syncs run one at a
// time, so a caller that finds nothing dirty knows an earlier sync that
// started after those writes has ended.
func (s *Store) syncWAL() error {
	w := s.wal
	w.syncMu.Lock()
	defer w.syncMu.Unlock()
	w.mu.Lock()
	// gen is the pass pos belongs to: a file may be switched away from and
	// back to (a new pass, from offset 0) while the fdatasync runs.
	type pending struct {
		f   *walFile
		gen uint64
		pos int64
	}
	var todo []pending
	for _, f := range w.files {
		if f.dirty {
			todo = append(todo, pending{f, f.gen, f.pos})
			f.dirty = false
		}
	}
	failed := w.failed
	w.mu.Unlock()
	if failed != nil {
		return failed
	}
	began := time.Now()
	for _, p := range todo {
		if err := w.fdatasync(p.f.f); err != nil {
			err = syncFailure(fmt.Errorf("logstore: fdatasync %s: %w", p.f.f.Name(), err))
			w.mu.Lock()
			w.failed = err
			w.mu.Unlock()
			return err
		}
	}
	if o := s.walSyncSeconds; o != nil && len(todo) > 0 {
		o.Observe(time.Since(began).Seconds())
	}
	if h := walSyncHook.Load(); h != nil {
		(*h)()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.lostPower {
		// The sync may not have reached the disk: PowerLoss keeps only
		// what syncs completed before it, so nothing after it is durable.
		return errPowerLoss
	}
	for _, p := range todo {
		// Only for the pass the sync was taken in. A pass begun meanwhile
		// (two switches bring the writer back to this file, or one to the
		// other file the sync also took) began after the sync was taken,
		// so nothing says the fdatasync covered any of it, however long
		// it has grown: counted for it, pos would go into the next entry's
		// w/synced and make a torn, never synced entry below it look like
		// damage to Open (ErrWALDamaged). The pass before is the
		// checkpoint's.
		if p.f.gen == p.gen {
			p.f.synced = max(p.f.synced, p.pos)
		}
	}
	if len(todo) > 0 {
		s.syncs.Add(1)
	}
	return nil
}

// walSyncHook, when set (tests only), runs between a WAL sync's fdatasyncs
// and its bookkeeping: the window in which the writer goes on appending,
// and switching files.
var walSyncHook atomic.Pointer[func()]

// putU64Synced writes a u64 value under key and syncs the database.
func (s *Store) putU64Synced(key []byte, v uint64) error {
	return s.putSynced(key, encodeU64(key, v))
}

// getU64Key reads a u64 value stored under key; absent is 0.
func (s *Store) getU64Key(key []byte) (uint64, bool, error) {
	b, ok, err := s.get(key)
	if err != nil || !ok {
		return 0, ok, err
	}
	v, err := decodeU64(key, b)
	return v, err == nil, err
}

// closeWAL closes the WAL files. At a clean Close it first moves w/gen past
// every generation written: the final markers just changed keys the group
// commit writes, so no replay may overwrite them with older values, and
// everything is in Badger, whose Close makes it durable. After a failure
// nothing is written: the next Open replays what the WAL holds.
func (s *Store) closeWAL(clean bool) error {
	w := s.wal
	w.mu.Lock()
	for w.checkpointing {
		w.cond.Wait()
	}
	next := w.files[w.cur].gen + 1
	failed := w.failed
	w.mu.Unlock()
	var err error
	if clean && failed == nil {
		// The batches indexed since the last checkpoint, before no
		// generation holding them is replayed any more (segment.go).
		err = s.segs.sync()
	}
	if clean && failed == nil && err == nil {
		err = s.db.Update(func(txn *badger.Txn) error { return txn.Set(walGenKey, encodeU64(walGenKey, next)) })
	}
	w.close()
	return errors.Join(failed, err)
}

// errPowerLoss fails a store whose power PowerLoss cut.
var errPowerLoss = errors.New("logstore: simulated power loss")

// PowerLoss is for fault-injection tests: it leaves the store's files as a
// machine that lost power now could. It fails the store at once (nothing
// more is written or counted as durable; a sync still running reports
// failure) and returns a function to call once the store is closed, which
// cuts each WAL file and each segment file to what a completed fdatasync
// covered, removes the segment files whose directory entry no completed
// sync covered, and deletes from Badger every record the synced part of
// the WAL's replayable generations holds: Badger is never synced for a
// group commit, so its copies of those may all be gone, while it may have
// kept pointers indexed from the part that is lost, which then point to
// segment bytes that are gone too. (What it keeps, a real power loss could
// keep too; Badger's metadata keys stay as they are, which a real loss
// could also leave, except that a truncation intent whose delete no
// completed sync covered is put back, as a real loss could leave it.) The
// next Open must recover every record that was durable.
func (s *Store) PowerLoss() (after func() error) {
	w := s.wal
	w.mu.Lock()
	w.lostPower = true
	type kept struct {
		gen    uint64
		synced int64
	}
	var keep [2]kept
	for i, f := range w.files {
		keep[i] = kept{f.gen, f.synced}
	}
	w.mu.Unlock()
	segsKept := s.segs.powerLoss()
	// Intents whose delete no sync that started after it has covered.
	lostClears := map[string]uint64{}
	s.syncGate.Lock()
	for id, c := range s.intentClears {
		if s.syncDone <= c.ticket {
			lostClears[id] = c.to
		}
	}
	s.syncGate.Unlock()
	_ = s.fail(errPowerLoss)
	return func() error {
		if err := losePowerSegments(s.segs.dir, segsKept); err != nil {
			return err
		}
		db, err := badger.Open(badgerOptions(s.badgerDir, s.log))
		if err != nil {
			return fmt.Errorf("logstore: power loss: open badger: %w", err)
		}
		err = s.losePower(db, func(i int) (uint64, int64) { return keep[i].gen, keep[i].synced }, lostClears)
		return errors.Join(err, db.Close())
	}
}

// losePower applies PowerLoss to the closed store's files, db open on its
// Badger directory. lostClears are the truncation intents (range id ->
// target) whose delete was never synced: they are put back.
func (s *Store) losePower(db *badger.DB, kept func(i int) (gen uint64, synced int64), lostClears map[string]uint64) error {
	var from uint64
	err := db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(walGenKey)
		if errors.Is(err, badger.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		b, err := item.ValueCopy(nil)
		if err != nil {
			return err
		}
		from, err = decodeU64(walGenKey, b)
		return err
	})
	if err != nil {
		return fmt.Errorf("logstore: power loss: read WAL generation: %w", err)
	}
	wb := db.NewWriteBatch()
	defer wb.Cancel()
	dropped := 0
	dir := filepath.Dir(s.badgerDir)
	for i := range 2 {
		gen, synced := kept(i)
		if gen != from && gen != from+1 {
			continue // checkpointed: Badger synced all of it
		}
		f, err := os.OpenFile(walPath(dir, i), os.O_RDWR, 0)
		if err != nil {
			return fmt.Errorf("logstore: power loss: %w", err)
		}
		pass, err := walEntries(f)
		if err == nil && pass.gen == gen {
			for j, p := range pass.payloads {
				if pass.ends[j] > synced {
					// Lost from the WAL. Badger may have kept what was
					// indexed of it (a memtable flush), and so keeps it
					// here: pointers to segment bytes that were never
					// synced either, which Open must refuse to read.
					break
				}
				err = walKVs(p, func(k, _ []byte) error {
					if isLogKey(k) {
						dropped++
						return wb.Delete(append([]byte(nil), k...))
					}
					return nil
				})
				if err != nil {
					break
				}
			}
		}
		if err == nil {
			err = f.Truncate(synced)
		}
		err = errors.Join(err, f.Close())
		if err != nil {
			return fmt.Errorf("logstore: power loss: WAL %d: %w", i, err)
		}
		s.log.Info("simulated power loss", "wal", i, "generation", gen, "kept_bytes", synced)
	}
	s.log.Info("simulated power loss dropped Badger's copies of the WAL's records", "records", dropped)
	for id, to := range lostClears {
		key := rangeKey(prefixIntent, id)
		if err := wb.Set(key, encodeU64(key, to)); err != nil {
			return fmt.Errorf("logstore: power loss: restore intent of %s: %w", id, err)
		}
		s.log.Info("simulated power loss kept a truncation intent whose delete was never synced", "range", id, "to", to)
	}
	return wb.Flush()
}
