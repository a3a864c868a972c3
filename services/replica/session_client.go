package replica

import (
	"context"
	"errors"
	"fmt"
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

// get returns the session to the leader, creating it on first use. A
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
		wake:    make(chan struct{}, 1),
	}
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
	// noSessionUntil: the leader answered Unimplemented; until then every
	// fetch loop is told errNoSession.
	noSessionUntil time.Time
	wake           chan struct{} // the sender has something to send

	// Streams and messages, for status and tests.
	streams  atomic.Uint64
	messages atomic.Uint64
}

// sessionPull is one range's pull, waiting for its answer.
type sessionPull struct {
	id   uint64
	req  *tenurev1.FetchRequest
	done chan pullResult // buffered: the answer never waits for the loop
}

type pullResult struct {
	a   *tenurev1.FetchResponse
	err error
}

// fetch sends req on the session and waits for its answer, a failure of
// the stream, or the end of ctx (the pull is then dropped on the leader
// too). errNoSession: the leader has no sessions, use FetchStream.
func (fs *fetchSession) fetch(ctx context.Context, req *tenurev1.FetchRequest) (*tenurev1.FetchResponse, error) {
	fs.mu.Lock()
	if time.Now().Before(fs.noSessionUntil) {
		fs.mu.Unlock()
		return nil, errNoSession
	}
	fs.nextID++
	p := &sessionPull{id: fs.nextID, req: req, done: make(chan pullResult, 1)}
	fs.waiting[p.id] = p
	fs.queue = append(fs.queue, p)
	if !fs.running {
		fs.running = true
		go fs.run()
	}
	fs.mu.Unlock()
	fs.signal()
	select {
	case r := <-p.done:
		return r.a, r.err
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
		fs.signal()
		return nil, context.Cause(ctx)
	}
}

// usable reports whether fetch loops should use the session now.
func (fs *fetchSession) usable() bool {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return !time.Now().Before(fs.noSessionUntil)
}

func (fs *fetchSession) signal() {
	select {
	case fs.wake <- struct{}{}:
	default:
	}
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
	fs.streams.Add(1)
	fs.s.metrics.sessionsOpened.Inc()
	st := fs.client.FetchSession(ctx)
	heartbeat := fs.s.cfg.FetchWait
	// A leader that is gone or cut off sends nothing, not even heartbeats.
	limit := heartbeat + fetchSlack
	var silent atomic.Bool
	watchdog := time.AfterFunc(limit, func() { silent.Store(true); cancel() })
	defer watchdog.Stop()

	fs.mu.Lock()
	// Every pull still waiting goes out on this stream: the ones sent on
	// the last one (which ended idle) died with it on the leader.
	fs.queue = fs.queue[:0]
	for _, p := range fs.waiting {
		fs.queue = append(fs.queue, p)
	}
	fs.forget = nil
	fs.mu.Unlock()

	sent := make(chan error, 1)
	go func() {
		err := fs.send(ctx, st, heartbeat)
		if err != nil {
			cancel() // Receive returns; its error says why, or this one does
		}
		sent <- err
	}()
	var err error
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
	cancel()
	serr := <-sent
	_ = st.CloseRequest()
	_ = st.CloseResponse()
	if err == nil {
		return nil
	}
	if serr != nil && ctx.Err() == nil {
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

// send writes the queued pulls and forgets, coalesced, until ctx ends.
func (fs *fetchSession) send(ctx context.Context, st *connect.BidiStreamForClient[tenurev1.FetchSessionRequest, tenurev1.FetchSessionResponse], heartbeat time.Duration) error {
	first := true
	for {
		for {
			m := fs.nextMessage()
			if m == nil && !first {
				break
			}
			if m == nil {
				m = &tenurev1.FetchSessionRequest{}
			}
			if first {
				m.HeartbeatMs = uint32(heartbeat / time.Millisecond)
				first = false
			}
			if err := st.Send(m); err != nil {
				return err
			}
			fs.s.metrics.fetchSent.Inc()
		}
		select {
		case <-fs.wake:
		case <-ctx.Done():
			return nil
		}
	}
}

// nextMessage takes up to wire.MaxSessionPulls queued pulls still waiting,
// and the forgets, or nil when there is nothing to send.
func (fs *fetchSession) nextMessage() *tenurev1.FetchSessionRequest {
	fs.mu.Lock()
	defer fs.mu.Unlock()
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
// idle: the message is a heartbeat and no pull waits.
func (fs *fetchSession) deliver(m *tenurev1.FetchSessionResponse) (idle bool) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for _, a := range m.GetAnswers() {
		p := fs.waiting[a.GetId()]
		if p == nil {
			continue // given up by its fetch loop
		}
		delete(fs.waiting, a.GetId())
		switch {
		case a.GetErrorCode() != 0:
			code := connect.Code(a.GetErrorCode())
			if code > connect.CodeUnauthenticated {
				code = connect.CodeUnknown
			}
			p.done <- pullResult{err: connect.NewError(code, errors.New(a.GetErrorMessage()))}
		case a.GetFetch() == nil:
			p.done <- pullResult{err: errors.New("fetch session answer carries no fetch answer")}
		default:
			p.done <- pullResult{a: a.GetFetch()}
		}
	}
	return len(m.GetAnswers()) == 0 && len(fs.waiting) == 0
}

// SessionMessages is how many messages this replica has received on its
// fetch sessions, heartbeats included.
func (s *Replica) SessionMessages() uint64 {
	s.sessions.mu.Lock()
	defer s.sessions.mu.Unlock()
	var n uint64
	for _, fs := range s.sessions.m {
		n += fs.messages.Load()
	}
	return n
}
