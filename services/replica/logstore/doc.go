// Package logstore is a replica's storage: each range's log of records, its
// durable state (fence, role, leader) and high-water mark in one Badger
// database, and its epoch journal (package journal) in a file of its own.
//
// A Store is opened once per replica process; a Range is one range in it.
// The leader appends with Append, a follower with AppendRecords; both return
// once the records are written (readable), and DurableEnd/WaitDurable say
// when they are durable. Concurrent appends across all ranges share one
// entry and one fdatasync of the store's write-ahead log (group commit,
// commit.go; the WAL, wal.go); the indexer later writes their batches to
// segment files and Badger receives pointers to them, many group commits
// in one transaction, and until then reads are served from memory
// (index.go, segment.go).
//
// # Invariants
//
// Per range, after every operation and after Open:
//
//   - offsets are dense from LogStart to LogEnd (nothing below LogStart is
//     readable: ErrBelowLogStart), and every record's epoch is at least its
//     predecessor's;
//   - LogStart <= HWM, and LogStart never decreases: only committed
//     records are ever removed from the front (AdvanceLogStart), or a
//     follower's whole log when it is wholly below the leader's log start
//     (ResetTo);
//   - DurableEnd <= LogEnd, and HWM <= LogEnd; the HWM never decreases while
//     open (after a power loss that took records it counted, Open lowers it
//     to what the log holds);
//   - FencedEpoch never decreases, and Epoch <= FencedEpoch; once SetState
//     raises it, no Append or RecordEpoch under a lower epoch is accepted,
//     and none accepted before is still pending;
//   - the journal describes the log: every entry starts at or below LogEnd
//     (exactly at LogEnd only for an epoch that wrote nothing yet), and the
//     last entry starting at or below a record's offset carries that
//     record's epoch; with LogStart > 0 its first entry is the one in force
//     at LogStart-1 (trimmed from the front, so it may start below
//     LogStart), or at LogStart itself when rebuilt from the records left,
//     or it is empty after ResetTo until the next record is appended;
//   - a journal entry is fsynced before any record of its epoch is written.
//
// # On-disk format
//
// dir/journal/<range>.journal is a journal file (see package journal).
// dir/badger is a Badger v4 database holding, for range id (which never
// contains '/'):
//
//	key                               value
//	l/<id>/<offset u64 BE>            pointer to a batch in a segment (segment.go), or
//	                                  batch: the records of one write, from offset
//	s/<id>                            state
//	h/<id>                            high-water mark       (u64 value)
//	d/<id>                            synced-end marker     (u64 value)
//	t/<id>                            truncation target     (u64 value, present only mid-truncation)
//	x/<id>                            drop intent           (u64 value 0, present only mid-drop)
//	b/<id>                            log start             (u64 value; absent: 0)
//	w/gen                             oldest WAL generation Open replays (u64 value)
//	w/synced                          only inside WAL entries, never in Badger: how far the
//	                                  WAL file was synced when the entry was written (wal.go)
//	m/<id>/<offset u64 BE>            time mark: every record below offset was written on this
//	                                  replica at or before this time (u64 value: unix ms;
//	                                  marks.go); at most 128 per range, none above the log end
//
//	batch:   batch magic u8 (0xB7) | count u32 | (length u32 | record) per
//	         record, the first record at the key's offset (see batch.go; a
//	         store written before batches holds a bare record per key, which
//	         reads as a batch of one)
//
//	record:  +-------------+----------+---------------+-----------------+
//	         | epoch u64   | flags u8 | crc32c u32    | value           |
//	         +-------------+----------+---------------+-----------------+
//	         flags bit 0: epoch-start record (value then empty); bit 1:
//	         producer record, whose value begins with a producer header
//	         (producer id [16]byte | producer epoch u32 | sequence u64),
//	         the idempotent producer's fields the dedupe state is derived
//	         from (producers.go); other bits 0.
//	         crc32c (Castagnoli) over value (producer header included),
//	         then the key of the record's own offset (l/<id>/<offset>),
//	         then epoch and flags: a record at any other range or offset
//	         fails it.
//
//	pointer: 0xB8 | count u32 | segment u32 | position u64 | length u32 |
//	         crc32c u32 over the key, the fields before it and the batch
//	         (the indexer writes pointers; a batch held in Badger itself is
//	         what stores written before segments hold, and what a
//	         truncation inside a batch rewrites)
//
//	u64 value: v u64 | crc32c u32 over the key then v.
//
//	state:   version u8 (2) | fenced epoch u64 | epoch u64 | role u32 |
//	         leader id str | leader address str | replica count u8 |
//	         (replica id str, replica address str, incarnation str,
//	         flags u8 (bit 0: learner)) per replica | generation u64 |
//	         crc32c u32 over the key then everything before it
//	         (str: u16 length, then the bytes, at most 1024). Version 1,
//	         written before, has neither incarnation nor flags nor
//	         generation, and reads as generation 0.
//
// dir/wal.0 and dir/wal.1 are the write-ahead log: every group commit's
// keys and values, in generations that Open replays into Badger (see wal.go
// for the entry format).
//
// dir/segments/<n>.seg (n from 1, %08d) hold stored batches back to back,
// as the pointers under l/ keys locate them (segment.go), each at most
// Options.SegmentBytes (64 MiB by default). A file no live pointer refers
// to, other than the one being written and the highest numbered, is
// deleted, only after a Badger sync that made the deletes of its last
// pointers durable (reclaim.go): no durable pointer ever names a missing
// file. A store written before time marks has none, and RetainSince
// answers its log start until marks written since cover its records.
//
// All integers are big-endian. These constants are part of the on-disk
// format: a store written by one version of tenure must be read by the next.
// Change them only with a new version byte and a migration.
//
// Every value is checked before it is written and verified right after it is
// read: the checksum says the bytes are the ones written, and the decoded
// fields are asserted too (epoch 0, unknown flags, an epoch-start record with
// data, Epoch > FencedEpoch are all refused as ErrCorrupt).
//
// The synced-end marker d/<id> is written with every commit that touches the
// range: records below it were fsynced before that commit. (With the sync
// pipelined behind the writes it may trail the durable end by a few
// batches; a clean Close sets it to the log end.) Open trusts the log below
// it and checks only the tail above it (see recoverLogEnd).
//
// # Crash safety
//
// Truncate persists an intent before cutting journal and log, and Open
// redoes it. Clearing the intent is synced too: records written after the
// cut are durable with the WAL alone, and a lost delete would let Open redo
// the cut over them. A sync that took a range's end before a truncation
// publishes nothing for it (syncEnd): the offsets may hold newer records by
// then. Open also cuts an unsynced log tail at its first hole, removes
// journal entries beyond the log end, verifies the journal against the log
// and rebuilds a missing, empty or corrupt journal from the records' epochs
// before the range is served. DropRange persists an intent before deleting
// a range's keys and journal, and Open finishes it before it lists the
// ranges, so a crash never leaves a range that looks hosted with part of its
// log. A range whose own stored data fails its checks at Open (its state,
// HWM, markers or intent, the record below its synced marker, its journal
// against its log: ErrCorrupt) is loaded quarantined (quarantine.go): it
// refuses every read and write with ErrQuarantined, nothing writes its keys,
// and the other ranges open and serve; I/O errors and Badger or the WAL
// failing still fail Open.
//
// AdvanceLogStart persists the new log start b/<id> (synced) before it
// removes anything: then it trims the journal's front (atomically, by
// rename) and deletes the l/ keys of the batches wholly below the start
// (a batch straddling it stays). Open deletes every batch wholly below the
// persisted start before it reads the log (a crash mid-advance, or the
// WAL's replay of batches already deleted, leaves some) and trims the
// journal again. The start is at most DurableEnd when set, so records at
// and above it survive any crash, and Open checks the log from
// max(synced-end marker, log start). ResetTo empties the journal first
// (a crash then leaves the old log, whose journal Open rebuilds), then
// persists log start, HWM and synced-end marker at the new start in one
// synced transaction, then deletes the old log keys.
//
// A full disk (disk.go) refuses new records before they get offsets
// (ErrDiskFull) and never changes what is on disk; a segment write refused
// for want of space leaves its batches in the WAL, unindexed, and a Close
// with any unindexed is unclean, so Open replays them.
//
// Options.CrashAt injects crashes at the steps of Truncate, AppendRecords,
// DropRange, AdvanceLogStart and ResetTo; Options.JournalFS injects journal
// faults.
package logstore
