// Package journal is a replica's epoch journal: the durable KIP-101 vector of
// (epoch, start offset) pairs for one range, and the arithmetic over it.
//
// An entry (epoch, start) says that this replica's first record written under
// epoch sits at offset start, so the entries partition the log into stretches
// by the leadership that wrote them. Two replicas hold identical records
// exactly as far as their vectors agree: a bare offset says where a replica
// is, not whose writes put it there. DivergencePoint and EndOffsetFor answer
// the two questions promotion and the fetch check ask of that vector.
//
// # History rules
//
// Epochs are positive and strictly increase; starts never decrease; there are
// at most MaxEntries entries. An empty history means "unknown", and a broken
// one (a journal poisoned by a failed write) also reads empty, never partial:
// a partial vector reads as authoritative and yields a truncation target
// computed from a hole, while "unknown" only ever disables reconciliation by
// epoch.
//
// # File format
//
// One append-only file per range:
//
//	+---------------------------+----------+----------+-----+----------+
//	| header: "TNRJRNL" 0x01    | entry 0  | entry 1  | ... | entry n-1|
//	| 8 bytes                   | 20 bytes | 20 bytes |     | 20 bytes |
//	+---------------------------+----------+----------+-----+----------+
//
//	entry: +---------------+---------------+------------------------------+
//	       | epoch uint64  | start uint64  | CRC-32C (Castagnoli) uint32  |
//	       | big-endian    | big-endian    | of the 16 preceding bytes,   |
//	       |               |               | big-endian                   |
//	       +---------------+---------------+------------------------------+
//
// These constants are part of the on-disk format: a journal written by one
// version of tenure must be read by the next. Change them only with a new
// version byte and a migration.
//
// Entries are fixed-size so that entry k always starts at byte 8+20k: a torn
// write can only damage the final entry, and cutting it means truncating the
// file to an entry boundary. There is no length prefix to trust.
//
// # Durability and recovery
//
// Open creates a missing file and fsyncs it and its parent directory. It
// refuses a file longer than MaxEntries entries plus one partial entry before
// reading or allocating anything for it. A final entry that is torn (fewer
// than 20 bytes) or fails its checksum is what an interrupted append leaves,
// because each entry is fsynced before the next is written; Open cuts it off,
// truncating the file to the last whole entry and fsyncing, so the next append
// lands on an entry boundary. Damage anywhere else, a wrong header or a
// non-advancing history cannot come from an interrupted append and is refused
// with ErrCorrupt: the replica then has no history until it rebuilds one from
// its log (every stored record carries its epoch) with Create.
//
// Record writes and fsyncs the entry before it returns, so an epoch is never
// observable before its start is durable. A failed write, fsync or truncate
// poisons the Journal: the bytes past the last durable entry are unknown, so it
// refuses further changes with ErrPoisoned and reads as an empty history until
// it is reopened and the file revalidated.
//
// TrimBefore removes entries from the front for a log whose front retention
// removed: it keeps the entry in force at the given offset and every later
// one, rewriting the file whole the way Create does (temporary file, fsync,
// rename, directory fsync), so a crash leaves the old journal or the new
// one. A trimmed history's first entry may start above 0 (and below the
// log start: its epoch is in force from there, whatever the log still
// holds of it); DivergencePoint compares such histories where both
// replicas hold records.
//
// All filesystem access goes through FS, so tests inject failing writes and
// fsyncs and simulate crashes that keep only synced bytes (package
// journaltest).
package journal
