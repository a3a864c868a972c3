// Package appender appends to a range's leader through LogService's
// AppendStream: a producer keeps streams open and each append is one stream
// message each way, instead of one unary call (request setup, headers and a
// handler goroutine per append). tenurectl bench and the benchmarks use it;
// so can any Go service that produces to tenure.
package appender

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/transport"
	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// Appender appends to one replica (a range's leader) over a pool of
// AppendStreams. It is safe for concurrent use: each call in flight holds a
// stream of its own (a stream carries one append at a time), and a stream
// goes back to the pool when its append is answered.
//
// Appends are idempotent by default (docs/idempotence.md): each stream of
// the pool is a producer of its own, with a random id and a sequence per
// range, so an append whose outcome is unknown is sent again, with the same
// sequence, and the leader writes it at most once. That needs a server that
// knows producer fields (an older one ignores them: use WithoutIdempotence
// against it).
type Appender struct {
	// dial makes the client of a leader another replica named (FollowLeader);
	// nil: no following.
	dial func(url string) tenurev1connect.LogServiceClient
	// locate finds a range's leader (LocateLeader); nil: only not-leader
	// answers are followed.
	locate     func(ctx context.Context, rangeID string) (string, error)
	idempotent bool
	retries    int

	mu     sync.Mutex
	client tenurev1connect.LogServiceClient
	// url is the leader followed to last ("" until then); gen counts the
	// follows, so a stream of an earlier leader never goes back to the pool.
	url    string
	gen    int
	idle   []*stream
	closed bool
}

type stream struct {
	s      *connect.BidiStreamForClient[tenurev1.AppendStreamRequest, tenurev1.AppendStreamResponse]
	cancel context.CancelFunc
	// prod is the producer this stream's appends are named by (nil
	// without idempotence), and seq its next sequence per range. A
	// producer outlives a broken stream: its retry goes out on the next.
	prod *producer
	// gen is the Appender's gen when the connection opened: a connection
	// to a leader since followed away from is closed when it comes back.
	gen int
}

type producer struct {
	id  []byte
	seq map[string]uint64
}

// Option configures an Appender.
type Option func(*Appender)

// FollowLeader makes the Appender follow a replica's not-leader answer:
// when the replica it appends to refuses an append naming another leader
// (a wire.NotLeader detail with its URL), it appends to that leader from
// then on, through a client from dial, and sends the refused append there
// once more. A refusal wrote nothing, so the retry cannot write it twice.
// At most maxFollows leaders per Append. Without it (the default), the
// refusal is Append's answer. A leader that crashed answers nothing and
// names nobody: LocateLeader finds its successor.
func FollowLeader(dial func(url string) tenurev1connect.LogServiceClient) Option {
	return func(a *Appender) { a.dial = dial }
}

// LocateLeader makes an Appender that follows the leader (FollowLeader,
// whose dial it uses; without FollowLeader it does nothing) also look for
// it with locate before it sends an append again: after an unknown outcome
// (the leader crashed or was cut off mid-append, its connections are
// refused) and after a not-leader answer that names no leader (a promotion
// is under way). A leader that crashed answers nothing, so no not-leader
// answer ever names its successor: without a locate function every retry
// goes to the dead address and the append fails once the retries are
// spent, however quickly a new leader serves. With one, the retry goes to
// the replica locate names, with the same producer sequence, so the new
// leader writes the records at most once (docs/idempotence.md).
//
// locate returns the leader's base URL, or "" when it knows of none yet
// (the Appender then tries where it was, and asks again before the next
// try). LeaseLeader reads it from the lease service.
func LocateLeader(locate func(ctx context.Context, rangeID string) (url string, err error)) Option {
	return func(a *Appender) { a.locate = locate }
}

// LeaseLeader is a locate function for LocateLeader: the range's leader as
// the lease service records it (LeaseService.GetRange), the member that
// holds the range's live lease, at its address in the membership. While a
// promotion runs the lease is the promoter's and no member's, and after
// a leader died it stays the dead one's until the promotion binds it to
// the new leader or its TTL runs out: "" or the old address then, and the
// Appender asks again before its next try. A producer's certificate may
// call GetRange.
func LeaseLeader(lc tenurev1connect.LeaseServiceClient) func(ctx context.Context, rangeID string) (string, error) {
	return func(ctx context.Context, rangeID string) (string, error) {
		resp, err := lc.GetRange(ctx, connect.NewRequest(&tenurev1.GetRangeRequest{RangeId: rangeID}))
		if err != nil {
			return "", err
		}
		r := resp.Msg.GetRange()
		l := r.GetLease()
		if !l.GetLive() || l.GetEpoch() != r.GetEpoch() {
			return "", nil
		}
		for _, m := range r.GetReplicas() {
			if m.GetId() == l.GetHolderId() {
				return m.GetAddress(), nil
			}
		}
		return "", nil
	}
}

// maxFollows bounds the leaders one Append follows: leadership moving that
// often is for the caller to wait out, not to chase.
const maxFollows = 3

// WithoutIdempotence makes appends plain (no producer fields): an append
// whose outcome is unknown is then returned as it is, never sent again.
func WithoutIdempotence() Option { return func(a *Appender) { a.idempotent = false } }

// WithRetries bounds how many times an idempotent append whose outcome is
// unknown is sent again (default DefaultRetries; 0: never).
func WithRetries(n int) Option { return func(a *Appender) { a.retries = max(n, 0) } }

// DefaultRetries is how many times an idempotent append with an unknown
// outcome is sent again by default, with retryBackoff doubling between
// tries (about 3 s in all, which covers a failover when the retries can
// reach the new leader: see LocateLeader), each within the call's context.
const DefaultRetries = 6

// retryBackoff is the first pause before a retry; it doubles, up to
// retryBackoffMax.
const (
	retryBackoff    = 50 * time.Millisecond
	retryBackoffMax = time.Second
)

// New returns an Appender that appends through client.
func New(client tenurev1connect.LogServiceClient, opts ...Option) *Appender {
	a := &Appender{client: client, idempotent: true, retries: DefaultRetries}
	for _, o := range opts {
		o(a)
	}
	return a
}

// errClosed is returned by Append after Close.
var errClosed = errors.New("appender: closed")

// Append appends records to rangeID and returns the acknowledgement: the
// records are committed (on a quorum) when it returns without error.
//
// An idempotent append (the default) whose outcome is unknown (Unavailable,
// DeadlineExceeded, a FailedPrecondition from a leader deposed while it
// waited, a connection lost mid-append) is sent again with the same
// producer sequence, up to the retry bound and within ctx: the leader
// answers a retry of records it holds with their original offsets. A
// not-leader answer is no unknown outcome (it wrote nothing): one naming
// the leader is Append's answer at once unless FollowLeader follows it, and
// one naming none (a promotion fenced the replica and has not yet told it
// its role) is sent again within the same bound, as is a full disk's
// ResourceExhausted. When Append still fails, the outcome is what the
// error says; a stream's producer for which some try's outcome stayed
// unknown is retired (its next sequence would be a gap if nothing was
// written, or a false duplicate of that try if it was).
//
// A leader whose dedupe window no longer holds the producer's records
// (retention removed them, or 2^20 offsets were appended since) refuses
// its next sequence with OutOfRange, writing nothing: unless some try of
// the append had an unknown outcome, Append sends it once more from a new
// producer, at sequence 0.
//
// Without idempotence, on an error the outcome is what Append's is for the
// same error: a refusal (InvalidArgument, NotFound, a FailedPrecondition
// naming another leader) wrote nothing, and so did an error for which
// transport.NotHandled reports true; anything else, including ctx ending
// and a connection lost mid-append (Unavailable, see transport.LostStream),
// is unknown.
//
// A stream the server stopped (a graceful restart drains every open stream,
// idle ones included) answers the append sent on it with an error saying it
// was never handled. Append then drops the pooled streams, which the same
// server stopped too, and sends the append once more on a new stream:
// nothing was written, so the retry cannot write it twice.
func (a *Appender) Append(ctx context.Context, rangeID string, records [][]byte) (*tenurev1.AppendResponse, error) {
	st, err := a.take()
	if err != nil {
		return nil, err
	}
	req := &tenurev1.AppendRequest{RangeId: rangeID, Records: records}
	if st.prod != nil {
		req.ProducerId, req.FirstSequence = st.prod.id, st.prod.seq[rangeID]
	}
	pause := retryBackoff
	follows := 0
	// unknown: some try of this append may have been written. Only the
	// last error is returned, but an earlier try's unknown outcome stays
	// unknown whatever a later try answered.
	unknown := false
	renewed := false
	for try := 0; ; try++ {
		ack, err := a.appendOnce(ctx, st, req)
		if err != nil && transport.NotHandled(err) && ctx.Err() == nil {
			a.dropIdle()
			ack, err = a.appendOnce(ctx, st, req)
		}
		// The Appender's gen when the connection that answered opened:
		// appendOnce keeps it after closing the connection on an error.
		answeredGen := st.gen
		if err == nil {
			if st.prod != nil {
				st.prod.seq[rangeID] += uint64(len(records))
			}
			a.put(st)
			return ack, nil
		}
		// A replica that no longer leads named the one that does: the
		// refusal wrote nothing, so the same request (the same sequence)
		// goes there at once. Not a retry of an unknown outcome: it does
		// not count against the retries, and is bounded on its own.
		if follows < maxFollows && ctx.Err() == nil && a.followNotLeader(err, answeredGen) {
			follows++
			try--
			continue
		}
		// The leader's dedupe window no longer holds this producer's
		// records (retention removed them, or 2^20 offsets were appended
		// since): it cannot check the sequence, and wrote nothing. With no
		// try of this append unknown, nothing of it exists anywhere, and
		// every earlier append of the producer was acknowledged (one that
		// was not retired it), so a new producer, at sequence 0, sends it
		// once more (Kafka's KIP-360 answer to a producer retention
		// forgot). A long-lived producer on a range with retention used to
		// get this refusal as Append's answer, after a quiet spell longer
		// than the range keeps records.
		if connect.CodeOf(err) == connect.CodeOutOfRange && st.prod != nil && !unknown && !renewed && ctx.Err() == nil {
			renewed = true
			st.prod = newProducer()
			req.ProducerId, req.FirstSequence = st.prod.id, 0
			try--
			continue
		}
		unknown = unknown || unknownOutcome(err)
		if st.prod == nil || !worthRetrying(err) || try == a.retries || ctx.Err() != nil {
			if st.prod != nil && unknown {
				st.prod = newProducer() // see above: the old one may have a gap
			}
			a.put(st)
			return nil, err
		}
		select {
		case <-ctx.Done():
		case <-time.After(pause):
		}
		pause = min(2*pause, retryBackoffMax)
		a.relocate(ctx, rangeID)
	}
}

// relocate points the Appender at the leader locate names, under
// LocateLeader, before a retry. Nothing changes when locate fails, knows
// of no leader, or names the replica already appended to.
func (a *Appender) relocate(ctx context.Context, rangeID string) {
	if a.locate == nil || a.dial == nil || ctx.Err() != nil {
		return
	}
	url, err := a.locate(ctx, rangeID)
	if err != nil || url == "" {
		return
	}
	a.follow(url)
}

// followNotLeader makes the leader a not-leader refusal names the replica
// appended to, under FollowLeader; false if there is nothing to follow (no
// detail, no FollowLeader, or the refusal came from the leader it names).
// gen is the Appender's gen when the connection that carried the refusal
// opened. Appends in flight together are refused together by a replica
// that no longer leads: the first to get here moves the Appender to the
// named leader, and the others, refused over a connection of an older gen,
// follow it there too. (Comparing the URL alone took their refusals for
// the named leader's own, and returned them.)
func (a *Appender) followNotLeader(err error, gen int) bool {
	if a.dial == nil {
		return false
	}
	url := wire.NotLeader(err).GetLeaderUrl()
	if url == "" {
		return false
	}
	if a.follow(url) {
		return true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	// Already there: followed since this connection opened, so the
	// refusal came from the replica left, not from url.
	return a.gen != gen
}

// follow makes url the replica appended to; false if it already is.
func (a *Appender) follow(url string) bool {
	a.mu.Lock()
	if a.url == url {
		a.mu.Unlock()
		return false
	}
	a.client, a.url = a.dial(url), url
	a.gen++
	a.mu.Unlock()
	// Idle streams keep their producers; their connections, to the old
	// leader, close now, and a stream in flight closes its own in put.
	a.dropIdle()
	return true
}

// AppendRequest sends req as it is, its producer fields included (the
// stream's own producer is not used), for a caller that keeps its own
// producer sequences and retries itself. It is sent once, and once more on a
// new stream if a stopped server never handled it; the outcome of an error
// is what Append's is without idempotence.
func (a *Appender) AppendRequest(ctx context.Context, req *tenurev1.AppendRequest) (*tenurev1.AppendResponse, error) {
	st, err := a.take()
	if err != nil {
		return nil, err
	}
	defer a.put(st)
	ack, err := a.appendOnce(ctx, st, req)
	if err != nil && transport.NotHandled(err) && ctx.Err() == nil {
		a.dropIdle()
		ack, err = a.appendOnce(ctx, st, req)
	}
	return ack, err
}

// unknownOutcome says whether an append that failed with err may have been
// written: anything but a refusal of the request itself. A not-leader
// answer (a NotLeaderDetail) and a full disk (ResourceExhausted) are
// refusals: the replica answers them before assigning offsets.
func unknownOutcome(err error) bool {
	if transport.NotHandled(err) || wire.NotLeader(err) != nil {
		return false
	}
	switch connect.CodeOf(err) {
	case connect.CodeInvalidArgument, connect.CodeNotFound, connect.CodeOutOfRange,
		connect.CodePermissionDenied, connect.CodeUnauthenticated, connect.CodeDataLoss,
		connect.CodeResourceExhausted:
		return false
	}
	return true
}

// worthRetrying says whether an idempotent append that failed with err is
// sent again to the same replica: an unknown outcome is (the retry turns
// it into a known one), and so are refusals that pass by themselves: a
// replica fenced by a promotion that knows no leader yet (it is adopted
// in a moment, and then leads or names the leader) and a full disk (it
// resumes once space is back). A not-leader answer that names the leader
// is not: that replica refuses every retry the same way, so the refusal
// is the answer unless FollowLeader followed it.
func worthRetrying(err error) bool {
	if nl := wire.NotLeader(err); nl != nil {
		return nl.GetLeaderUrl() == ""
	}
	return unknownOutcome(err) || connect.CodeOf(err) == connect.CodeResourceExhausted
}

func newProducer() *producer {
	id := make([]byte, 16)
	// crypto/rand never fails (Go 1.24); 128 random bits never collide
	// in practice (docs/idempotence.md).
	_, _ = rand.Read(id)
	return &producer{id: id, seq: map[string]uint64{}}
}

// appendOnce sends the append on st's connection (opened if it has none)
// and waits for its answer. On an error the connection is closed.
func (a *Appender) appendOnce(ctx context.Context, st *stream, req *tenurev1.AppendRequest) (*tenurev1.AppendResponse, error) {
	if st.s == nil {
		a.mu.Lock()
		client, gen := a.client, a.gen
		a.mu.Unlock()
		sctx, cancel := context.WithCancel(context.Background())
		st.s, st.cancel, st.gen = client.AppendStream(sctx), cancel, gen
	}
	// The stream outlives the call; the call's context ends only this call,
	// and the stream with it (its state is then unknown).
	stop := context.AfterFunc(ctx, st.cancel)
	err := st.s.Send(&tenurev1.AppendStreamRequest{Append: req})
	var m *tenurev1.AppendStreamResponse
	if err == nil || errors.Is(err, io.EOF) {
		// A Send on a stream the server ended fails with io.EOF; the
		// server's reason is what Receive returns.
		m, err = st.s.Receive()
	}
	// A leader that crashed or was cut off ends the body mid-stream; that
	// is Unavailable (outcome unknown), not the Internal connect-go says.
	err = transport.LostStream(err)
	if !stop() {
		err = fmt.Errorf("append: %w (stream ended: %v)", context.Cause(ctx), err)
	}
	if err == nil && m.GetAppend() == nil {
		err = errors.New("append: the answer carries no acknowledgement")
	}
	if err != nil {
		st.close()
		return nil, err
	}
	return m.GetAppend(), nil
}

// take returns an idle stream or opens one.
func (a *Appender) take() (*stream, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, errClosed
	}
	if n := len(a.idle); n > 0 {
		st := a.idle[n-1]
		a.idle = a.idle[:n-1]
		return st, nil
	}
	st := &stream{}
	if a.idempotent {
		st.prod = newProducer()
	}
	return st, nil
}

// put returns a stream to the pool, or closes it if the Appender closed
// or followed another leader since the stream opened.
func (a *Appender) put(st *stream) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		st.close()
		return
	}
	if st.gen != a.gen {
		// Its connection is to a leader followed away from since.
		st.close()
	}
	// A stream without a connection (its last one broke) keeps its
	// producer in the pool, and opens a connection on its next append.
	a.idle = append(a.idle, st)
}

func (st *stream) close() {
	if st.s == nil {
		return
	}
	st.cancel()
	_ = st.s.CloseRequest()
	_ = st.s.CloseResponse()
	st.s, st.cancel = nil, nil
}

// dropIdle closes the idle streams' connections: their next appends open
// new ones. Their producers stay, with their sequences.
func (a *Appender) dropIdle() {
	a.mu.Lock()
	idle := slices.Clone(a.idle)
	a.mu.Unlock()
	for _, st := range idle {
		a.mu.Lock()
		// Taken meanwhile? Then its append owns it.
		held := slices.Contains(a.idle, st)
		if held {
			st.close()
		}
		a.mu.Unlock()
	}
}

// Close closes the idle streams; calls in flight close theirs when they
// end. Append fails after Close.
func (a *Appender) Close() {
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	a.dropIdle()
}
