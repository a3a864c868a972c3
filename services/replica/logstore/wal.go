package logstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sync"
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
// order. crc is crc32c over the previous entry's crc (0 for a pass's first
// entry), the entry's offset in the file, then the first 12 bytes and the
// payload (walCRC). Chained and placed: what lies beyond a pass's end is an
// older pass, whose bytes at an arbitrary offset may be record values a
// client chose; an entry there checks out only by matching a chain value
// that depends on everything this pass wrote before it.

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

type walFile struct {
	f   *os.File
	gen uint64 // generation of the pass being written (or last written)
	pos int64  // where the next entry goes
	// prevCRC is the checksum of the entry before pos (0 at a pass's start).
	prevCRC uint32
	// synced is where the entries a completed fdatasync covered end (in
	// this pass); PowerLoss keeps no more of the file than that.
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

// walEntries reads the entries of one file's current pass: from its start,
// while they are whole, check out and carry the first entry's generation.
// gen is 0 when the file holds no valid entry. ends[i] is where entry i
// ends in the file.
func walEntries(f *os.File) (gen uint64, payloads [][]byte, ends []int64, err error) {
	data, err := readAllFile(f)
	if err != nil {
		return 0, nil, nil, err
	}
	var prev uint32
	for pos := 0; len(data)-pos >= walHeaderBytes; {
		h := data[pos : pos+walHeaderBytes]
		g := binary.BigEndian.Uint64(h[0:8])
		n := int(binary.BigEndian.Uint32(h[8:12]))
		if g == 0 || (gen != 0 && g != gen) || n > len(data)-pos-walHeaderBytes {
			break // zeros, another pass, or torn
		}
		payload := data[pos+walHeaderBytes : pos+walHeaderBytes+n]
		crc := walCRC(prev, int64(pos), h[0:12], payload)
		if crc != binary.BigEndian.Uint32(h[12:16]) {
			break // torn, never written, or not this pass's
		}
		prev = crc
		gen = g
		payloads = append(payloads, payload)
		pos += walHeaderBytes + n
		ends = append(ends, int64(pos))
	}
	return gen, payloads, ends, nil
}

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
	for i, f := range w.files {
		if gens[i], entries[i], _, err = walEntries(f.f); err != nil {
			return err
		}
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
	n := 0
	for i := range keys {
		n += 8 + len(keys[i]) + len(vals[i])
	}
	if cap(w.buf) < walHeaderBytes+n {
		w.buf = make([]byte, 0, walHeaderBytes+n)
	}
	buf := w.buf[:walHeaderBytes]
	for i := range keys {
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(keys[i])))
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(vals[i])))
		buf = append(buf, keys[i]...)
		buf = append(buf, vals[i]...)
	}
	if w.files[w.cur].pos >= walSwitchBytes && !w.checkpointing {
		s.switchLocked()
	}
	f := w.files[w.cur]
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
	type pending struct {
		f   *walFile
		pos int64
	}
	var todo []pending
	for _, f := range w.files {
		if f.dirty {
			todo = append(todo, pending{f, f.pos})
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
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.lostPower {
		// The sync may not have reached the disk: PowerLoss keeps only
		// what syncs completed before it, so nothing after it is durable.
		return errPowerLoss
	}
	for _, p := range todo {
		// A pass switched meanwhile starts from 0 again; pos then belongs
		// to the pass before, which the checkpoint covers.
		if p.pos <= p.f.pos {
			p.f.synced = max(p.f.synced, p.pos)
		}
	}
	if len(todo) > 0 {
		s.syncs.Add(1)
	}
	return nil
}

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
		g, entries, ends, err := walEntries(f)
		if err == nil && g == gen {
			for j, p := range entries {
				if ends[j] > synced {
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
