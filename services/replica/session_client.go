package replica

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/transport"
	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// The follower's side of a fetch session (session.go has the leader's): one
// FetchSession stream per leader replica carries the pull of every range
// this replica follows there. Each range's fetch loop (follower.step) is
// unchanged: it builds its pull, hands it to the session (fetch) and waits
// for that range's answer, then checks and applies it as before. The
// session adds only the transport: pulls made at once go out in one
// message, the answers the leader sends at once arrive in one, and the
// fetch loops they wake write their records together, so the store's WAL
// syncs them in one group commit.
//
// Failure is per stream, as it was per range: a stream that breaks, or
// carries nothing (not even a heartbeat) for FetchWait plus fetchSlack,
// fails every pull waiting on it, and each fetch loop backs off and pulls
// again on a new stream.

// errNoSession: the leader has no FetchSession (an older replica); the
// fetch loop uses its per-range FetchStream instead.
var errNoSession = errors.New("leader has no FetchSession")

// noSessionRetry is how long a leader that answered Unimplemented is
// served per range before a session is tried again (it may have been
// upgraded in place).
const noSessionRetry = time.Minute

// sessionKey names a leader replica: its id (the TLS identity its client
// checks) and its address.
type sessionKey struct{ leaderID, address string }

// fetchSessions are a replica's sessions, one per leader replica.
type fetchSessions struct {
	mu sync.Mutex
	m  map[sessionKey]*fetchSession
}

// session returns the session to the leader, creating it on first use. A
// session runs a stream only while it has pulls waiting, so one that is no
// longer used costs a map entry.
func (s *Replica) session(leaderID, address string) *fetchSession {
	ss := &s.sessions
	ss.mu.Lock()
	defer ss.mu.Unlock()
	k := sessionKey{leaderID, address}
	if fs := ss.m[k]; fs != nil {
		return fs
	}
	if ss.m == nil {
		ss.m = map[sessionKey]*fetchSession{}
	}
	fs := &fetchSession{
		s:       s,
		key:     k,
		client:  tenurev1connect.NewReplicaServiceClient(s.httpClient(), address, transport.ClientOptions(transport.ForReplica(leaderID))...),
		waiting: map[uint64]*sessionPull{},
	}
	fs.sent = sync.NewCond(&fs.mu)
	ss.m[k] = fs
	return fs
}

// fetchSession is the follower's session with one leader replica.
type fetchSession struct {
	s      *Replica
	key    sessionKey
	client tenurev1connect.ReplicaServiceClient

	mu      sync.Mutex
	nextID  uint64
	waiting map[uint64]*sessionPull // handed in and not answered
	queue   []*sessionPull          // not yet sent (some may be gone from waiting)
	forget  []uint64                // sent, then given up by their fetch loop
	running bool                    // a goroutine runs streams (run)
	// cur is the open stream pulls are sent on (nil between streams),
	// curCancel ends it; sending is set while a goroutine writes to it
	// (flush), sent is signalled on fs.mu when it stops; sendErr is the
	// failed write that ended cur.
	cur       *connect.BidiStreamForClient[tenurev1.FetchSessionRequest, tenurev1.FetchSessionResponse]
	curCancel context.CancelFunc
	sending   bool
	sent      *sync.Cond
	sendErr   error
	lastSent  time.Time // when a message last went out on cur
	// noSessionUntil: the leader answered Unimplemented; until then every
	// fetch loop is told errNoSession.
	noSessionUntil time.Time

	// following counts the fetch loops following a range on this leader:
	// a range alone there keeps its own FetchStream (follower.fetch).
	following atomic.Int64
	// messages counts the messages received on the session; applied
	// counts the answers the session wrote for their fetch loops
	// (deliver). Tests read them (SessionMessages, SessionAppliedAnswers
	// in export_test.go).
	messages, applied atomic.Uint64
}

// sessionPull is one range's pull, waiting for its answer.
type sessionPull struct {
	id   uint64
	f    *follower // the fetch loop that pulls
	req  *tenurev1.FetchRequest
	done chan pullResult // buffered: the answer never waits for the loop
}

// pullResult is a pull's answer, with applied set when the session wrote
// its records for the loop (deliver), or why the pull failed.
type pullResult struct {
	a       *tenurev1.FetchResponse
	applied *applied
	err     error
}

// fetch sends req on the session and waits for its answer, a failure of
// the stream, or the end of ctx (the pull is then dropped on the leader
// too). errNoSession: the leader has no sessions, use FetchStream.
func (fs *fetchSession) fetch(ctx context.Context, f *follower, req *tenurev1.FetchRequest) pullResult {
	fs.mu.Lock()
	if time.Now().Before(fs.noSessionUntil) {
		fs.mu.Unlock()
		return pullResult{err: errNoSession}
	}
	fs.nextID++
	p := &sessionPull{id: fs.nextID, f: f, req: req, done: make(chan pullResult, 1)}
	fs.waiting[p.id] = p
	fs.queue = append(fs.queue, p)
	if !fs.running {
		fs.running = true
		go fs.run()
	}
	fs.mu.Unlock()
	fs.flush()
	select {
	case r := <-p.done:
		return r
	case <-ctx.Done():
		fs.mu.Lock()
		if _, ok := fs.waiting[p.id]; ok {
			delete(fs.waiting, p.id)
			// Queued pulls are skipped by the sender; this one may have
			// gone out already, so the leader is told to drop it (an id
			// it does not hold is ignored).
			fs.forget = append(fs.forget, p.id)
		}
		fs.mu.Unlock()
		fs.flush()
		return pullResult{err: context.Cause(ctx)}
	}
}

// usable reports whether fetch loops should use the session now.
func (fs *fetchSession) usable() bool {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return !time.Now().Before(fs.noSessionUntil)
}

// heartbeat sends an empty message on st whenever nothing was sent on it
// for a heartbeat, until ctx ends.
func (fs *fetchSession) heartbeat(ctx context.Context, st *connect.BidiStreamForClient[tenurev1.FetchSessionRequest, tenurev1.FetchSessionResponse], every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fs.mu.Lock()
		if fs.cur != st || fs.sending || time.Since(fs.lastSent) < every {
			fs.mu.Unlock()
			continue
		}
		fs.sending = true
		fs.mu.Unlock()
		if fs.write(st, &tenurev1.FetchSessionRequest{}) {
			// Pulls handed in during the write found it sending and
			// left their sending to it.
			fs.flush()
		}
	}
}

// flush sends what is queued on the open stream unless another goroutine
// is sending: the fetch loop handing in a pull writes it itself, with every
// pull queued by then, and pulls queued while a write is in progress go out
// together in the next message, written by the goroutine that wrote the
// last one. A failed write ends the stream.
//
// As on the leader's side (servedSession.flush), the writer first lets the
// goroutines waiting for a P run (beforePulls): under load those include
// the fetch loops of other ranges whose answers were just applied, about
// to hand in their next pulls, which then share this message.
func (fs *fetchSession) flush() {
	for {
		fs.mu.Lock()
		st := fs.cur
		if st == nil || fs.sending || (len(fs.queue) == 0 && len(fs.forget) == 0) {
			fs.mu.Unlock()
			return
		}
		fs.sending = true
		fs.mu.Unlock()
		// Pulls handed in meanwhile are queued and leave their sending to
		// this goroutine (fs.sending is set).
		beforePulls(fs.queuedCount)
		fs.mu.Lock()
		var m *tenurev1.FetchSessionRequest
		if fs.cur == st {
			m = fs.nextMessageLocked()
		}
		if m == nil {
			// The stream ended meanwhile (its pulls are sent again on the
			// next), or every pull queued was given up.
			fs.sending = false
			fs.sent.Broadcast()
			ended := fs.cur != st
			fs.mu.Unlock()
			if ended {
				continue
			}
			return
		}
		fs.mu.Unlock()
		if !fs.write(st, m) {
			return
		}
	}
}

// queuedCount is how many pulls are queued to be sent (some may have been
// given up since).
func (fs *fetchSession) queuedCount() int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return len(fs.queue)
}

// write sends m on st; the caller set fs.sending, which write clears. A
// failed write ends the stream. It reports whether the write succeeded.
func (fs *fetchSession) write(st *connect.BidiStreamForClient[tenurev1.FetchSessionRequest, tenurev1.FetchSessionResponse], m *tenurev1.FetchSessionRequest) bool {
	err := st.Send(m)
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.sending = false
	fs.sent.Broadcast()
	if err == nil {
		fs.lastSent = time.Now()
		fs.s.metrics.fetchSent.Inc()
		return true
	}
	if fs.cur == st {
		fs.sendErr = err
		fs.curCancel()
		fs.cur = nil
	}
	return false
}

// run opens streams while pulls wait, failing the waiting pulls when a
// stream fails. It ends, clearing running, once nothing waits.
func (fs *fetchSession) run() {
	for {
		fs.mu.Lock()
		if len(fs.waiting) == 0 || fs.s.ctx.Err() != nil {
			fs.running = false
			fs.failLocked(fmt.Errorf("replica is closed: %w", context.Cause(fs.s.ctx)))
			fs.mu.Unlock()
			return
		}
		fs.mu.Unlock()
		if err := fs.stream(); err != nil {
			fs.mu.Lock()
			fs.failLocked(err)
			fs.mu.Unlock()
		}
	}
}

// failLocked answers every waiting pull with err. fs.mu is held.
func (fs *fetchSession) failLocked(err error) {
	for id, p := range fs.waiting {
		p.done <- pullResult{err: err}
		delete(fs.waiting, id)
	}
	fs.queue, fs.forget = nil, nil
}

// stream runs one FetchSession stream. It returns nil when the stream ended
// idle (a heartbeat with nothing waiting): pulls handed in meanwhile stay
// queued for the next stream. Otherwise it returns why the stream failed.
func (fs *fetchSession) stream() error {
	ctx, cancel := context.WithCancel(fs.s.ctx)
	defer cancel()
	fs.s.metrics.sessionsOpened.Inc()
	st := fs.client.FetchSession(ctx)
	heartbeat := fs.s.cfg.FetchWait
	// A leader that is gone or cut off sends nothing, not even heartbeats.
	limit := heartbeat + fetchSlack
	var silent atomic.Bool
	watchdog := time.AfterFunc(limit, func() { silent.Store(true); cancel() })
	defer watchdog.Stop()
	// The follower heartbeats too: the leader ends a session it has heard
	// nothing on for the heartbeat plus fetchSlack (session.go), so that
	// a follower gone or cut off does not keep its pulls held there.
	go fs.heartbeat(ctx, st, heartbeat)

	// The first message names the heartbeat and carries every pull still
	// waiting: the ones sent on the last stream (which ended idle) died
	// with it on the leader.
	fs.mu.Lock()
	fs.queue = fs.queue[:0]
	for _, p := range fs.waiting {
		fs.queue = append(fs.queue, p)
	}
	fs.forget, fs.sendErr = nil, nil
	first := fs.nextMessageLocked()
	if first == nil {
		first = &tenurev1.FetchSessionRequest{}
	}
	first.HeartbeatMs = uint32(heartbeat / time.Millisecond)
	fs.mu.Unlock()
	err := st.Send(first)
	if err == nil {
		fs.s.metrics.fetchSent.Inc()
		fs.mu.Lock()
		fs.cur, fs.curCancel, fs.lastSent = st, cancel, time.Now()
		fs.mu.Unlock()
		fs.flush() // pulls handed in during the first write
		for {
			m, rerr := st.Receive()
			if rerr != nil {
				err = rerr
				break
			}
			watchdog.Reset(limit)
			fs.messages.Add(1)
			fs.s.metrics.fetchReceived.Inc()
			if fs.deliver(m) {
				break // idle: nothing waits, and the leader had nothing to say for a heartbeat
			}
		}
	} else {
		// A Send on a stream the leader ended fails with io.EOF; its
		// reason (an error, or Unimplemented) is what Receive returns.
		_, err = st.Receive()
	}
	// No write may be in progress when the stream is closed.
	fs.mu.Lock()
	if fs.cur == st {
		fs.cur = nil
	}
	for fs.sending {
		fs.sent.Wait()
	}
	serr := fs.sendErr
	fs.mu.Unlock()
	cancel()
	_ = st.CloseRequest()
	_ = st.CloseResponse()
	if err == nil {
		return nil
	}
	if serr != nil && !errors.Is(serr, io.EOF) {
		err = serr
	}
	err = transport.LostStream(err)
	if silent.Load() {
		err = fmt.Errorf("no message within %v: %w", limit, err)
	}
	if connect.CodeOf(err) == connect.CodeUnimplemented {
		fs.mu.Lock()
		fs.noSessionUntil = time.Now().Add(noSessionRetry)
		fs.mu.Unlock()
		fs.s.cfg.Logger.Info("leader has no FetchSession; fetching per range", "leader", fs.key.leaderID, "address", fs.key.address, "retry_after", noSessionRetry)
		return errNoSession
	}
	return fmt.Errorf("fetch session with %s: %w", fs.key.leaderID, err)
}

// nextMessageLocked takes up to wire.MaxSessionPulls queued pulls still
// waiting, and the forgets, or nil when there is nothing to send. fs.mu is
// held.
func (fs *fetchSession) nextMessageLocked() *tenurev1.FetchSessionRequest {
	var m *tenurev1.FetchSessionRequest
	n := 0
	for n < len(fs.queue) {
		p := fs.queue[n]
		if _, ok := fs.waiting[p.id]; ok {
			if m == nil {
				m = &tenurev1.FetchSessionRequest{}
			}
			if len(m.Pulls) == wire.MaxSessionPulls {
				break
			}
			m.Pulls = append(m.Pulls, &tenurev1.SessionPull{Id: p.id, Fetch: p.req})
		}
		n++
	}
	fs.queue = fs.queue[n:]
	if len(fs.forget) > 0 {
		if m == nil {
			m = &tenurev1.FetchSessionRequest{}
		}
		k := min(len(fs.forget), wire.MaxSessionPulls)
		m.Forget, fs.forget = fs.forget[:k:k], fs.forget[k:]
	}
	return m
}

// deliver hands each answer to its pull. It reports whether the stream is
// idle: the message is a heartbeat, no pull waits, and fewer than two
// ranges are followed on this leader (only then do ranges use the session,
// follower.fetch). Without the last condition a heartbeat arriving while
// every range was between an answer and its next pull closed the stream of
// a session in use, and the next pulls paid for a new one.
//
// When the message carries records for two or more ranges, deliver writes
// them itself (queueApply): every range's records are queued, then one
// group commit writes them and one WAL sync makes them durable, and each
// fetch loop is handed its answer as applied. Handed to the loops, each
// would commit on its own, and the first would sync alone while the others
// queued behind it: one record in flight per range made that one or two
// syncs per record on every follower. Answers of any other kind, and those
// queueApply leaves alone, are handed to their loops first, unchanged.
func (fs *fetchSession) deliver(m *tenurev1.FetchSessionResponse) (idle bool) {
	type answer struct {
		p *sessionPull
		r pullResult
	}
	var got []answer
	withRecords := 0
	fs.mu.Lock()
	for _, a := range m.GetAnswers() {
		p := fs.waiting[a.GetId()]
		if p == nil {
			continue // given up by its fetch loop
		}
		delete(fs.waiting, a.GetId())
		var r pullResult
		switch {
		case a.GetErrorCode() != 0:
			code := connect.Code(a.GetErrorCode())
			if code > connect.CodeUnauthenticated {
				code = connect.CodeUnknown
			}
			r.err = connect.NewError(code, errors.New(a.GetErrorMessage()))
		case a.GetFetch() == nil:
			r.err = errors.New("fetch session answer carries no fetch answer")
		default:
			r.a = a.GetFetch()
			if len(r.a.GetRecords()) > 0 {
				withRecords++
			}
		}
		got = append(got, answer{p, r})
	}
	idle = len(m.GetAnswers()) == 0 && len(fs.waiting) == 0 && fs.following.Load() < 2
	fs.mu.Unlock()

	type queuedAnswer struct {
		answer
		finish func() applied
	}
	var queued []queuedAnswer
	for _, g := range got {
		if withRecords > 1 && g.r.a != nil {
			if finish := g.p.f.queueApply(g.p.req, g.r.a); finish != nil {
				queued = append(queued, queuedAnswer{g, finish})
				continue
			}
		}
		g.p.done <- g.r
	}
	for _, q := range queued {
		ap := q.finish()
		q.r.applied = &ap
		fs.applied.Add(1)
		q.p.done <- q.r
	}
	return idle
}
