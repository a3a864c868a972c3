// Package check holds what a chaos run observed and the checkers that judge
// it: lost, duplicated and inconsistent records, divergent committed
// prefixes, HWM regressions, stale-epoch acceptances, truncations that cut an
// acknowledged record, and linearizability of the client history under a
// porcupine model of an append-only log. The in-process harness
// (internal/chaos) and the container chaos (deploy/compose/chaos) both fill a
// Run and call Check; the scoreboard adds Reports up.
package check

import (
	"sync"
	"time"
)

// Outcome is what a client knows of an operation it issued.
type Outcome uint8

const (
	// OK: the server answered success.
	OK Outcome = iota + 1
	// Failed: the operation certainly had no effect (refused before any
	// write, e.g. dial refused or "not the leader").
	Failed
	// Unknown: it may or may not have taken effect (timeout, connection
	// lost mid-call, a leader fenced while the append waited to commit).
	Unknown
)

func (o Outcome) String() string {
	switch o {
	case OK:
		return "ok"
	case Failed:
		return "failed"
	case Unknown:
		return "unknown"
	}
	return "invalid"
}

// Kind is a client operation's kind.
type Kind uint8

const (
	// Append appends one record.
	Append Kind = iota + 1
	// Read reads committed records from an offset.
	Read
)

func (k Kind) String() string {
	switch k {
	case Append:
		return "append"
	case Read:
		return "read"
	}
	return "invalid"
}

// Record is one log record as a read or a replica's log holds it.
type Record struct {
	Offset     uint64
	Epoch      uint64
	Value      []byte
	EpochStart bool // a leader's epoch-start record: no client data
}

// Op is one client operation and what came of it.
type Op struct {
	Client int
	Range  string
	Kind   Kind
	// Value is the record an Append sent (unique across the run).
	Value []byte
	// Offset: for an OK Append, the acknowledged offset; for a Read, the
	// requested start offset.
	Offset uint64
	// Epoch: for an OK Append, the epoch the acknowledgement named.
	Epoch uint64
	// Records and HWM: for an OK Read, the records returned (epoch-start
	// records included, as served) and the high-water mark answered.
	Records []Record
	HWM     uint64
	// Limited is true when an OK Read stopped at its record or byte limit
	// rather than at the HWM.
	Limited bool
	// BelowLogStart marks an OK Read the replica answered OutOfRange with
	// a LogStartDetail (wire.BelowLogStart): Offset is below the range's
	// log start, whose records were committed and deleted by retention on
	// purpose. Such a read returns no records and no HWM; it is a normal
	// answer, and the reader starts again at LogStart.
	BelowLogStart bool `json:",omitempty"`
	// LogStart is, for an OK Read, the log start the replica reported: the
	// one ReadResponse.log_start answered, or the one a BelowLogStart
	// answer named. 0 when it named none.
	LogStart uint64 `json:",omitempty"`
	Outcome  Outcome
	Err      string // the error, for Failed and Unknown
	// Call and Return bound the operation in real time. Return of an
	// Unknown op is when the client gave up; the checker treats it as
	// possibly taking effect at any time after Call.
	Call, Return time.Time
}

// History records operations from concurrent clients.
type History struct {
	mu  sync.Mutex
	ops []Op
}

// Add records one finished operation.
func (h *History) Add(op Op) {
	h.mu.Lock()
	h.ops = append(h.ops, op)
	h.mu.Unlock()
}

// Ops returns a copy of everything recorded so far.
func (h *History) Ops() []Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Op(nil), h.ops...)
}

// EpochStart is one entry of a replica's epoch history: epoch Epoch wrote
// the log from offset Start.
type EpochStart struct {
	Epoch, Start uint64
}

// ReplicaLog is one replica's final state of one range, read after the run
// (from its store, with the replica stopped, or through tenurectl).
type ReplicaLog struct {
	Replica string
	Range   string
	// LogStart is the lowest offset the replica holds, as it reports it:
	// the records below it were committed and deleted by retention on
	// purpose (or, on a follower reset to its leader's log start, never
	// copied), and are judged nowhere on this replica.
	LogStart    uint64
	LogEnd      uint64
	HWM         uint64
	FencedEpoch uint64
	History     []EpochStart
	// Records holds every record the replica stores, committed or not,
	// from LogStart to LogEnd.
	Records []Record
	// NotVoter says the replica is not a voter of the range at the end of
	// the run (removed by a membership change, or left a learner): its
	// committed prefix is judged like any other (a removed replica may lag,
	// never differ), but it is no part of the majority that must hold every
	// committed record, since the voters in effect alone are (joint
	// quorums carry every committed record from the old voters to the new).
	NotVoter bool `json:",omitempty"`
}

// HWMSample is one observation of a replica's high-water mark of a range.
// Incarnation counts the replica's restarts: HWM is only required to be
// monotonic within one incarnation, and across a clean restart.
type HWMSample struct {
	Replica     string
	Incarnation int
	Range       string
	HWM         uint64
	// LogStart is the replica's log start in the same status answer
	// (RangeStatus.log_start): the harness's evidence that retention ran.
	LogStart uint64 `json:",omitempty"`
	At       time.Time
}

// EventKind names what a replica accepted at an epoch.
type EventKind uint8

const (
	// Fenced: the replica answered Fence(Epoch) with success; from Return
	// on it must accept nothing below Epoch.
	Fenced EventKind = iota + 1
	// Acked: the replica acknowledged an append at Epoch.
	Acked
	// Truncated: the replica accepted Truncate at Epoch.
	Truncated
	// Adopted: the replica accepted Adopt at Epoch.
	Adopted
	// ServedFetch: the replica, as leader, answered a fetch at Epoch.
	ServedFetch
)

func (k EventKind) String() string {
	switch k {
	case Fenced:
		return "fenced"
	case Acked:
		return "acked"
	case Truncated:
		return "truncated"
	case Adopted:
		return "adopted"
	case ServedFetch:
		return "served-fetch"
	}
	return "invalid"
}

// EpochEvent is one successful epoch-bearing call a replica answered,
// observed at its server.
type EpochEvent struct {
	Replica      string
	Range        string
	Kind         EventKind
	Epoch        uint64
	Call, Return time.Time
}

// Truncation is one truncation a promotion commanded (from the transition
// records): replica Replica of Range cut to To at promotion epoch Epoch,
// when its fence answer reported History and LogEnd. Or, with FetchLeader
// set, one the replica made itself as a follower fetching at Epoch, on
// FetchLeader's divergence answer (RangeStatus.last_fetch_truncation_*),
// with the History and LogEnd of its fence at Epoch: the records it cut
// are ones it held then, since a leader never answers that its own
// records diverge.
type Truncation struct {
	Replica     string
	Range       string
	Epoch       uint64
	To          uint64
	LogEnd      uint64
	History     []EpochStart
	FetchLeader string `json:",omitempty"`
}

// Run is everything one chaos run observed.
type Run struct {
	Seed   int64
	Faults map[string]int // faults injected, by kind
	// TrafficBefore and TrafficDuring count OK operations before the first
	// fault and while faults were active; FinalAppendOK says whether the
	// append after healing succeeded. A run without all three does not count.
	TrafficBefore, TrafficDuring int
	FinalAppendOK                bool
	History                      []Op
	Final                        []ReplicaLog
	HWMs                         []HWMSample
	Epochs                       []EpochEvent
	Truncations                  []Truncation
	// Liveness is what each range of the run did after healing; every
	// harness fills one per range and healing (the in-process one heals
	// once per episode).
	Liveness []Liveness
}
