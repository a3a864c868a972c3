// Package wire holds tenure's API, generated from proto/ into tenure/v1, and
// the hand-written rules every message must obey before anything acts on it:
// size bounds, range id syntax, and epoch history validation.
//
// A peer's message is a claim. Everything a handler or client receives is
// checked here first, so no service allocates or decides on a peer's say-so.
package wire

// These bounds are part of the protocol: two versions of tenure that disagree
// on them cannot talk. Change them only with a compatibility plan.
const (
	// MaxEpochStarts bounds an epoch history (the KIP-101 vector) on the wire
	// and on disk. It is one constant on purpose: a journal that a replica can
	// recover locally must always be transmittable, or the replica would report
	// "unknown" to every peer while its vector sat intact on disk. 4096
	// leadership changes of one range means a flapping cluster an operator must
	// see; the reader must not allocate on a peer's say-so regardless.
	MaxEpochStarts = 4096

	// MaxRecordBytes bounds one record's value. 1 MiB keeps a single record well
	// inside one fetch answer and one Badger value-log entry.
	MaxRecordBytes = 1 << 20

	// MaxBatchRecords bounds the records of one Append or one fetch answer.
	// Batching is what makes the data path fast (one HTTP/2 request per record
	// tops out near 23k/s on a 2-core box); 4096 x 1 KiB is 4 MiB, a batch
	// the leader can group-commit in one fsync.
	MaxBatchRecords = 4096

	// MaxBatchBytes bounds the summed value bytes of one batch.
	MaxBatchBytes = 8 << 20

	// MaxMessageBytes is the read limit every Connect handler and client sets:
	// a full batch plus per-record framing and an epoch history, with headroom.
	// It must exceed MaxBatchBytes + MaxEpochStarts*EpochStartWireBytes.
	MaxMessageBytes = 16 << 20

	// EpochStartWireBytes is an upper bound on one encoded EpochStart
	// (two varint uint64 fields with tags, plus the repeated-field framing).
	EpochStartWireBytes = 24

	// MaxRangeIDBytes bounds a range id: it is a key component in etcd and
	// Badger and a file name for the journal.
	MaxRangeIDBytes = 128

	// MaxAddressBytes bounds a replica's address (a base URL) as a request
	// names it. The membership, with up to 2 x MaxReplicas addresses while
	// a change is in flight, is one etcd value; an unbounded address was
	// refused by etcd as "request is too large" and answered Internal.
	MaxAddressBytes = 1024

	// MaxReplicas bounds a range's replica set. Five is the largest set the
	// design uses; nine leaves room without letting a request name thousands.
	MaxReplicas = 9

	// MaxFetchWaitMillis bounds a follower's long poll, so a leader never holds
	// a request (and its goroutine) open on a peer's say-so.
	MaxFetchWaitMillis = 10_000

	// MaxRangesPerBatch bounds the ranges one batched call names
	// (FenceRanges, AdoptRanges, GrantEpochs, BindLeases). The largest answer
	// is FenceRanges' with every history full: 128 x (MaxEpochStarts x
	// EpochStartWireBytes + framing) is ~12.6 MiB, inside MaxMessageBytes.
	// Beyond ~100 ranges a batch saves little more per range anyway: a mass
	// failover of 1,000 ranges is a handful of calls per replica.
	MaxRangesPerBatch = 128

	// MaxSessionPulls bounds the pulls one FetchSession message carries and
	// the pulls a leader holds for one session (one per range it leads
	// there). A follower with more ranges on one leader sends them in
	// several messages; a pull is ~100 bytes, so a full message is ~1.6 MiB.
	MaxSessionPulls = 16384

	// MaxReadRecords bounds one Read answer.
	MaxReadRecords = MaxBatchRecords
)
