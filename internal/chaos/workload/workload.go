// Package workload is the chaos suite's client load: concurrent appends of
// unique values and reads of the committed tail against whichever replica
// leads a range, each operation recorded in a check.History with its outcome
// (ok, failed, unknown) and its call and return times. The in-process harness
// and the container chaos run the same workload; only how the clients reach
// the replicas differs (Config.HTTP).
package workload

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/internal/chaos/check"
	"github.com/tenurelog/tenure/pkg/appender"
	"github.com/tenurelog/tenure/pkg/transport"
	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// ErrNotSent marks an error from a client transport that refused a request
// before sending any of it (a partition the test made). Such an operation
// certainly had no effect.
var ErrNotSent = errors.New("request not sent")

// Config configures a Workload.
type Config struct {
	// Range is the range the clients append to and read from.
	Range string
	// Replicas maps each replica's id to its base URL.
	Replicas map[string]string
	// HTTP is how the clients reach the replicas.
	HTTP connect.HTTPClient
	// History receives every operation. Required.
	History *check.History
	// Prefix makes this run's values unique (e.g. the seed).
	Prefix string
	// Clients is the number of concurrent clients; default 4.
	Clients int
	// ReadEvery makes every n-th operation of a client a read; default 4.
	ReadEvery int
	// Readers is the number of clients that only read, each keeping the
	// leader it found until a read there fails, as a consumer with a cached
	// leader does; default 1 (negative: none). The other clients share one
	// belief and move on together at the first failed append, so without
	// these no read would reach a deposed leader that still answers.
	Readers int
	// FromStartEvery makes about one read in n start at offset 0, as a
	// consumer reading the range from its beginning does; default 8
	// (negative: none). Under retention such a read lands below the log
	// start: the replica answers OutOfRange naming the log start, the
	// history records that answer (check.Op.BelowLogStart), and the read
	// starts again at the log start, as a consumer does.
	FromStartEvery int
	// OpTimeout bounds one operation; default 2s.
	OpTimeout time.Duration
	// Pace is a client's pause between operations; default 5ms. It bounds
	// the history's size, which bounds the linearizability check.
	Pace time.Duration
	// Seed seeds the clients' choices (read offsets).
	Seed uint64
	// RetryFor bounds how long a client retries an append whose outcome is
	// unknown, with the same producer sequence (each client is an
	// idempotent producer); default 3 * OpTimeout. The retries are one
	// operation of the history, from the first call to the last return.
	RetryFor time.Duration
}

// Workload runs clients against one range.
type Workload struct {
	cfg     Config
	clients map[string]tenurev1connect.LogServiceClient
	status  map[string]tenurev1connect.ReplicaServiceClient
	ids     []string

	leader atomic.Pointer[string] // the replica believed to lead; nil = unknown
	hwm    atomic.Uint64          // the highest HWM seen, to aim reads at the tail
	ok     atomic.Int64           // OK operations so far
	seq    atomic.Uint64          // for the final appends' values
}

// New builds a Workload.
func New(cfg Config) (*Workload, error) {
	if cfg.Range == "" || len(cfg.Replicas) == 0 || cfg.HTTP == nil || cfg.History == nil {
		return nil, errors.New("workload: Range, Replicas, HTTP and History are required")
	}
	if cfg.Clients <= 0 {
		cfg.Clients = 4
	}
	if cfg.ReadEvery <= 0 {
		cfg.ReadEvery = 4
	}
	if cfg.Readers == 0 {
		cfg.Readers = 1
	}
	if cfg.FromStartEvery == 0 {
		cfg.FromStartEvery = 8
	}
	if cfg.OpTimeout <= 0 {
		cfg.OpTimeout = 2 * time.Second
	}
	if cfg.Pace <= 0 {
		cfg.Pace = 5 * time.Millisecond
	}
	if cfg.RetryFor <= 0 {
		cfg.RetryFor = 3 * cfg.OpTimeout
	}
	w := &Workload{cfg: cfg, clients: map[string]tenurev1connect.LogServiceClient{}, status: map[string]tenurev1connect.ReplicaServiceClient{}}
	for id, url := range cfg.Replicas {
		w.ids = append(w.ids, id)
		w.clients[id] = tenurev1connect.NewLogServiceClient(cfg.HTTP, url, transport.ClientOptions()...)
		w.status[id] = tenurev1connect.NewReplicaServiceClient(cfg.HTTP, url, transport.ClientOptions()...)
	}
	return w, nil
}

// OK is the number of operations that succeeded so far.
func (w *Workload) OK() int { return int(w.ok.Load()) }

// Run runs the clients until ctx is done.
func (w *Workload) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for c := range w.cfg.Clients + max(w.cfg.Readers, 0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if c < w.cfg.Clients {
				w.client(ctx, c)
			} else {
				w.reader(ctx, c)
			}
		}()
	}
	wg.Wait()
}

// client appends and reads. Odd-numbered clients append on AppendStreams
// (pkg/appender, one per replica, kept across appends as a producer keeps
// its connection), the others with unary Append calls, so the checkers
// judge both paths.
func (w *Workload) client(ctx context.Context, c int) {
	rng := rand.New(rand.NewPCG(w.cfg.Seed, uint64(c)))
	var streams map[string]*appender.Appender
	if c%2 == 1 {
		streams = map[string]*appender.Appender{}
		for id, lc := range w.clients {
			streams[id] = appender.New(lc)
		}
		defer func() {
			for _, a := range streams {
				a.Close()
			}
		}()
	}
	prod := newProducer()
	for n := 0; ctx.Err() == nil; n++ {
		if n%w.cfg.ReadEvery == w.cfg.ReadEvery-1 {
			w.read(ctx, c, &w.leader, rng)
		} else {
			w.append(ctx, c, fmt.Sprintf("%s-c%d-%d", w.cfg.Prefix, c, n), streams, prod)
		}
		w.pace(ctx)
	}
}

// reader only reads, from the leader it believes in on its own.
func (w *Workload) reader(ctx context.Context, c int) {
	rng := rand.New(rand.NewPCG(w.cfg.Seed, uint64(c)))
	var belief atomic.Pointer[string]
	for ctx.Err() == nil {
		w.read(ctx, c, &belief, rng)
		w.pace(ctx)
	}
}

func (w *Workload) pace(ctx context.Context) {
	select {
	case <-ctx.Done():
	case <-time.After(w.cfg.Pace):
	}
}

// AppendOne appends value, retrying (each try recorded) until one is
// acknowledged or within passes. It is the run's final append: the run
// counts only if it succeeds.
func (w *Workload) AppendOne(ctx context.Context, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	var last error
	for ctx.Err() == nil {
		v := fmt.Sprintf("%s-final-%d", w.cfg.Prefix, w.seq.Add(1))
		if last = w.append(ctx, -1, v, nil, nil); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("workload: no append acknowledged within %v: %w", within, last)
}

// ReadOne reads from the highest HWM seen, retrying (each try recorded)
// until a read is answered OK or within passes: with AppendOne, the
// liveness checker's proof that the range serves again.
func (w *Workload) ReadOne(ctx context.Context, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	var belief atomic.Pointer[string]
	rng := rand.New(rand.NewPCG(w.cfg.Seed, 0x72656164))
	var last error
	for ctx.Err() == nil {
		if last = w.read(ctx, -1, &belief, rng); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("workload: no read answered within %v: %w", within, last)
}

// producer is a client's idempotent producer (docs/idempotence.md): its
// id, epoch and next sequence.
type producer struct {
	id    []byte
	epoch uint32
	seq   uint64
}

func newProducer() *producer {
	id := make([]byte, 16)
	_, _ = crand.Read(id) // never fails (Go 1.24)
	return &producer{id: id}
}

// append appends one value to the believed leader and records the outcome:
// on the client's stream to it if streams holds one, else with Append. With
// a producer, an unknown outcome is retried, at whoever leads then, with the
// same sequence, for up to RetryFor: the leader writes the value at most
// once, so a retry turns an unknown outcome into a known one.
func (w *Workload) append(ctx context.Context, c int, value string, streams map[string]*appender.Appender, prod *producer) error {
	id := w.findLeader(ctx, &w.leader)
	if id == "" {
		return errors.New("no leader found")
	}
	op := check.Op{Client: c, Range: w.cfg.Range, Kind: check.Append, Value: []byte(value), Call: time.Now()}
	req := &tenurev1.AppendRequest{RangeId: w.cfg.Range, Records: [][]byte{[]byte(value)}}
	if prod != nil {
		req.ProducerId, req.ProducerEpoch, req.FirstSequence = prod.id, prod.epoch, prod.seq
	}
	var ack *tenurev1.AppendResponse
	var err error
	var errs []string
	unknown := false // some try may have written the value
	for deadline := op.Call.Add(w.cfg.RetryFor); ; {
		ack, err = w.appendTry(ctx, id, req, streams)
		if err == nil {
			break
		}
		errs = append(errs, fmt.Sprintf("%s: %v", id, err))
		forget(&w.leader, id)
		unknown = unknown || Classify(err) == check.Unknown
		if prod == nil || !unknown || ctx.Err() != nil || time.Now().After(deadline) {
			break
		}
		w.pace(ctx)
		if id = w.findLeader(ctx, &w.leader); id == "" {
			id = w.ids[0] // nobody leads yet: the try fails, and we go on
		}
	}
	op.Return = time.Now()
	switch {
	case err == nil:
		op.Outcome = check.OK
	case unknown:
		op.Outcome = check.Unknown
	default:
		op.Outcome = check.Failed
	}
	if err == nil {
		op.Offset, op.Epoch = ack.GetBaseOffset(), ack.GetEpoch()
		w.seenHWM(ack.GetHighWaterMark())
		w.ok.Add(1)
	} else {
		op.Err = strings.Join(errs, "; ")
	}
	if prod != nil {
		switch op.Outcome {
		case check.OK:
			prod.seq++
		case check.Unknown:
			// Perhaps written, perhaps not: the next sequence could
			// be a gap. A new producer epoch starts again at 0.
			prod.epoch, prod.seq = prod.epoch+1, 0
		}
		// Failed: nothing was written; the next value takes the sequence.
	}
	w.cfg.History.Add(op)
	return err
}

// appendTry sends req once to replica id.
func (w *Workload) appendTry(ctx context.Context, id string, req *tenurev1.AppendRequest, streams map[string]*appender.Appender) (*tenurev1.AppendResponse, error) {
	cctx, cancel := context.WithTimeout(ctx, w.cfg.OpTimeout)
	defer cancel()
	if a := streams[id]; a != nil {
		return a.AppendRequest(cctx, req)
	}
	resp, err := w.clients[id].Append(cctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// maxLogStartRestarts bounds how many times one read starts again at the
// log start a below-log-start answer named: retention may move the start
// past the new offset before the next read arrives, but not every time.
const maxLogStartRestarts = 3

// read reads from a little below the highest HWM seen to the tail, or now
// and then from offset 0 (FromStartEvery), at the leader belief names, and
// returns the read's error. An answer that the offset is below the log
// start is no error: it is recorded, and the read starts again there.
func (w *Workload) read(ctx context.Context, c int, belief *atomic.Pointer[string], rng *rand.Rand) error {
	id := w.findLeader(ctx, belief)
	if id == "" {
		return errors.New("no leader found")
	}
	from := w.hwm.Load()
	from -= min(from, uint64(rng.IntN(16)))
	if w.cfg.FromStartEvery > 0 && rng.IntN(w.cfg.FromStartEvery) == 0 {
		from = 0
	}
	for restarts := 0; ; restarts++ {
		start, below, err := w.readAt(ctx, c, id, belief, from)
		if !below {
			return err
		}
		if start <= from {
			// The replica refused an offset at or above the start it
			// named: the checker flags that answer; reading there again
			// would only repeat it.
			return fmt.Errorf("%s: read from %d answered below the log start %d", id, from, start)
		}
		if restarts == maxLogStartRestarts {
			return fmt.Errorf("%s: read still below the log start (%d) after %d restarts", id, start, restarts)
		}
		from = start
	}
}

// readAt reads from offset from at replica id and records the operation.
// below says the replica answered that from is below its log start (start).
func (w *Workload) readAt(ctx context.Context, c int, id string, belief *atomic.Pointer[string], from uint64) (start uint64, below bool, err error) {
	const maxRecords = 64
	op := check.Op{Client: c, Range: w.cfg.Range, Kind: check.Read, Offset: from, Call: time.Now()}
	cctx, cancel := context.WithTimeout(ctx, w.cfg.OpTimeout)
	resp, err := w.clients[id].Read(cctx, connect.NewRequest(&tenurev1.ReadRequest{RangeId: w.cfg.Range, Offset: from, MaxRecords: maxRecords}))
	cancel()
	op.Return = time.Now()
	if start, below := wire.BelowLogStart(err); below {
		// Records below the log start were committed and deleted by
		// retention: a normal answer, recorded as one. It is not counted
		// in OK(): the replica answers it before confirming that it still
		// leads, so it proves nothing about the range serving. The reader
		// keeps its leader.
		op.Outcome, op.BelowLogStart, op.LogStart = check.OK, true, start
		w.cfg.History.Add(op)
		return start, true, nil
	}
	op.Outcome = Classify(err)
	if err != nil {
		// A failed or unknown read changed nothing; it is recorded for the
		// outcome counts only.
		op.Err = fmt.Sprintf("%s: %v", id, err)
		forget(belief, id)
		w.cfg.History.Add(op)
		return 0, false, err
	}
	op.HWM, op.LogStart = resp.Msg.GetHighWaterMark(), resp.Msg.GetLogStart()
	for _, r := range resp.Msg.GetRecords() {
		op.Records = append(op.Records, check.Record{Offset: r.GetOffset(), Epoch: r.GetEpoch(), Value: r.GetValue(), EpochStart: r.GetEpochStart()})
	}
	// The read stopped at its limit, not at the HWM, when its last record
	// is not the last committed one.
	if n := len(op.Records); n > 0 && op.Records[n-1].Offset+1 < op.HWM {
		op.Limited = true
	}
	w.seenHWM(op.HWM)
	w.ok.Add(1)
	w.cfg.History.Add(op)
	return 0, false, nil
}

func (w *Workload) seenHWM(h uint64) {
	for {
		cur := w.hwm.Load()
		if h <= cur || w.hwm.CompareAndSwap(cur, h) {
			return
		}
	}
}

// forget drops id from belief, if belief still names it.
func forget(belief *atomic.Pointer[string], id string) {
	if p := belief.Load(); p != nil && *p == id {
		belief.CompareAndSwap(p, nil)
	}
}

// findLeader returns the replica belief names, asking every replica's
// status when it names none: the one leading at the highest epoch, at its
// fenced epoch, with a live lease, which it then stores in belief. "" when
// none is found (within ctx).
func (w *Workload) findLeader(ctx context.Context, belief *atomic.Pointer[string]) string {
	if p := belief.Load(); p != nil {
		return *p
	}
	var best string
	var bestEpoch uint64
	for _, id := range w.ids {
		cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		resp, err := w.status[id].GetStatus(cctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: w.cfg.Range}))
		cancel()
		if err != nil || len(resp.Msg.GetRanges()) != 1 {
			continue
		}
		st := resp.Msg.GetRanges()[0]
		if st.GetRole() == tenurev1.Role_ROLE_LEADER && st.GetEpoch() == st.GetFencedEpoch() && st.GetLeaseValid() && st.GetEpoch() > bestEpoch {
			best, bestEpoch = id, st.GetEpoch()
		}
	}
	if best == "" {
		// Nobody leads yet (a promotion is running): back off a little.
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
		return ""
	}
	belief.Store(&best)
	return best
}

// Classify says what a client knows of an operation from its error. Only
// refusals that happen before anything is written are Failed: a request the
// transport never sent, a connection refused, a stream end marked never
// handled (transport.NotHandled), and the replica's own "not the leader"
// answers, which it gives before writing. Everything else, a timeout, a
// lost connection, a leader fenced while the append waited to commit, is
// Unknown: the record may be on followers and commit later.
func Classify(err error) check.Outcome {
	if err == nil {
		return check.OK
	}
	if errors.Is(err, ErrNotSent) {
		return check.Failed
	}
	if transport.NotHandled(err) {
		// A stream the replica stopped (draining, closing) answered this
		// append instead of handling it; the checker's failed-applied
		// column holds the replica to that.
		return check.Failed
	}
	msg := err.Error()
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable:
		if strings.Contains(msg, "connection refused") {
			return check.Failed
		}
	case connect.CodeNotFound, connect.CodeInvalidArgument:
		return check.Failed
	case connect.CodeFailedPrecondition:
		// The replica's pre-write refusals (hosted.notLeaderErr and the
		// lease check in appendLocal). "fenced at epoch N; leader unknown"
		// and "lost its lease ... not acknowledging" come after the write
		// and stay Unknown.
		for _, pre := range []string{"is not the leader", "but is not serving", "not accepting appends"} {
			if strings.Contains(msg, pre) {
				return check.Failed
			}
		}
	}
	return check.Unknown
}
