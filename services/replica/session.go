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
	"google.golang.org/protobuf/proto"

	"github.com/tenurelog/tenure/internal/sched"
	"github.com/tenurelog/tenure/pkg/transport"
	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// The leader's side of a fetch session (Kafka's KIP-227, here one stream per
// follower replica carrying all its pulls to this replica): every pull is a
// Fetch held until its range has news (fetchUntil with held set), each on a
// goroutine of its own, and the answers ready at once go out in one message.
// Per range nothing changes: the KIP-320 check, counting the follower's
// offset toward the commit, the HWM and log start in every answer, and every
// fence rule are Fetch's own code. What changes is the cost of an idle
// range: none. With a Fetch per range, each range's long poll expired and
// was asked again every FetchWait; 1,000 idle ranges at RF 3 were 4,000
// messages a second between replicas (bench/README.md, idle ranges).

// defaultHeartbeat is the heartbeat when the follower names none.
const defaultHeartbeat = time.Second

// sessionAnswerBudget bounds the answers coalesced into one message, in
// encoded bytes: under wire.MaxMessageBytes with room for framing. One
// answer is at most wire.MaxBatchBytes of values plus record framing and
// epoch starts, well under it, so an answer always fits alone.
const sessionAnswerBudget = wire.MaxMessageBytes - 1<<20

// servedSession is one FetchSession on the leader's side.
type servedSession struct {
	s  *Replica
	st *connect.BidiStream[tenurev1.FetchSessionRequest, tenurev1.FetchSessionResponse]

	mu        sync.Mutex
	held      map[string]*heldPull // range id -> its held pull
	byID      map[uint64]*heldPull
	ready     []*tenurev1.SessionAnswer // answered, not yet sent
	heartbeat time.Duration
	ended     bool // set once the session ends: no pull starts after it
	// sending is set while a goroutine writes to the stream (flush); sent
	// is when the last message went out; sendErr is the first failed
	// send, also posted on failed.
	sending bool
	sent    time.Time
	sendErr error
	failed  chan struct{}
	// heard is when the follower's last message arrived (unix nanoseconds).
	heard atomic.Int64

	// pulls is the parent of every pull's context: cancelled when the
	// session ends, so every held pull returns.
	pulls      context.Context
	stopPulls  context.CancelFunc
	pullsGroup sync.WaitGroup
}

// heldPull is one pull the leader holds.
type heldPull struct {
	id      uint64
	rangeID string
	cancel  context.CancelFunc
}

// FetchSession serves one follower replica's session until the follower
// closes it, the connection fails, or this replica stops (Unavailable: a
// pull is a read and the follower's checked position, so a follower just
// asks again on a new stream).
func (s *Replica) FetchSession(ctx context.Context, st *connect.BidiStream[tenurev1.FetchSessionRequest, tenurev1.FetchSessionResponse]) error {
	ss := &servedSession{
		s:         s,
		st:        st,
		held:      map[string]*heldPull{},
		byID:      map[uint64]*heldPull{},
		heartbeat: defaultHeartbeat,
		sent:      time.Now(),
		failed:    make(chan struct{}),
	}
	ss.pulls, ss.stopPulls = context.WithCancel(ctx)
	received := make(chan error, 1) // buffered: the receiver may end after we stopped listening
	ss.heard.Store(time.Now().UnixNano())
	go func() {
		for {
			m, err := st.Receive()
			ss.heard.Store(time.Now().UnixNano())
			if errors.Is(err, io.EOF) {
				err = errSessionClosed
			} else if err == nil {
				err = ss.take(m)
			}
			if err != nil {
				received <- err
				return
			}
		}
	}()
	err, receiverEnded := ss.watch(ctx, received)
	// Every pull ends (their fetches return on the cancelled context, and
	// a pull sending its answer finishes the send) and the receiver leaves
	// Receive before the handler returns: nothing may touch the stream
	// after that (interceptors keep state in it).
	ss.mu.Lock()
	ss.ended = true
	ss.mu.Unlock()
	ss.stopPulls()
	ss.pullsGroup.Wait()
	if !receiverEnded {
		stopReceiving(ctx)
		<-received
	}
	if errors.Is(err, errSessionClosed) {
		return nil
	}
	return err
}

// errSessionClosed: the follower closed its side; the session ends cleanly.
var errSessionClosed = errors.New("follower closed the fetch session")

// watch sends heartbeats until the session ends, and returns why, and
// whether the receiver has ended (its error is then the reason).
func (ss *servedSession) watch(ctx context.Context, received chan error) (err error, receiverEnded bool) {
	timer := time.NewTimer(ss.heartbeatDue())
	defer timer.Stop()
	for {
		select {
		case <-timer.C:
			if d := ss.silence(); d > 0 {
				// A follower heartbeats too (session_client.go): one
				// silent this long is gone or cut off. Without this its
				// pulls stayed held, counted as fetches in hand (so
				// status never called it "not fetching"), until the
				// kernel gave up on the connection, many minutes later.
				return connect.NewError(connect.CodeUnavailable, fmt.Errorf("no message from the follower for %v: ending its fetch session", d.Round(time.Millisecond))), false
			}
			ss.beat()
			timer.Reset(ss.heartbeatDue())
		case <-ss.failed:
			ss.mu.Lock()
			defer ss.mu.Unlock()
			return ss.sendErr, false
		case err := <-received:
			return toConnect(err), true
		case <-transport.Draining(ctx):
			return connect.NewError(connect.CodeUnavailable, errors.New("replica is stopping; open a new fetch session")), false
		case <-ss.s.ctx.Done():
			return connect.NewError(connect.CodeUnavailable, errors.New("replica is closed")), false
		case <-ctx.Done():
			return ctx.Err(), false
		}
	}
}

func (ss *servedSession) heartbeatNow() time.Duration {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.heartbeat
}

// silence is how long the follower has been silent if that is past its
// heartbeat plus fetchSlack, else 0.
func (ss *servedSession) silence() time.Duration {
	d := time.Since(time.Unix(0, ss.heard.Load()))
	if d > ss.heartbeatNow()+fetchSlack {
		return d
	}
	return 0
}

// heartbeatDue is how long from now the next heartbeat is due: a
// heartbeat after the last message sent.
func (ss *servedSession) heartbeatDue() time.Duration {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return max(time.Millisecond, ss.heartbeat-time.Since(ss.sent))
}

// beat sends an empty message if nothing went out for a whole heartbeat:
// it tells the follower the stream lives.
func (ss *servedSession) beat() {
	ss.mu.Lock()
	if ss.sending || ss.ended || time.Since(ss.sent) < ss.heartbeat {
		ss.mu.Unlock()
		return // a message is going out, or went out lately
	}
	ss.sending = true
	ss.mu.Unlock()
	ss.sendOne(&tenurev1.FetchSessionResponse{})
	ss.flush() // answers that came ready meanwhile
}

// post queues an answer and sends: the answer's own goroutine writes it,
// with every answer ready by then, unless another goroutine is writing;
// that one then sends this answer too before it stops (flush). So the
// answers ready at once go out in one message, and an answer alone costs
// no hand-off to a sending goroutine.
func (ss *servedSession) post(a *tenurev1.SessionAnswer) {
	ss.mu.Lock()
	ss.ready = append(ss.ready, a)
	ss.mu.Unlock()
	ss.flush()
}

// flush sends the ready answers unless another goroutine is sending.
//
// Before it takes them it lets the goroutines waiting for a P run
// (beforeAnswers): under load those include other ranges' pulls, woken by
// appends already made, about to post their answers, and their answers
// then share this message instead of each going out alone. Measured with
// the bench module at 100 ranges, one append in flight each: 3.1 messages
// between replicas per record before (nearly one per answer and one per
// pull), 0.96 after; 1.9 and 0.13 at 1,000 ranges. An idle process has
// nothing waiting, and sends at once.
func (ss *servedSession) flush() {
	for {
		ss.mu.Lock()
		if ss.sending || ss.sendErr != nil || len(ss.ready) == 0 {
			ss.mu.Unlock()
			return
		}
		ss.sending = true
		ss.mu.Unlock()
		// Answers posted meanwhile join ss.ready and leave their sending
		// to this goroutine (ss.sending is set).
		beforeAnswers(ss.readyCount)
		ss.mu.Lock()
		m := ss.nextMessageLocked()
		ss.mu.Unlock()
		ss.sendOne(m)
	}
}

// beforeAnswers and beforePulls run before a session's sender, on the
// leader's side and on the follower's, takes what is ready into a message;
// queued says how many answers or pulls wait now. Variables so tests can
// stand in for the goroutines they let run.
var beforeAnswers, beforePulls = letOthersRun, letOthersRun

// letOthersRun lets the goroutines waiting for a P run first (see flush).
func letOthersRun(queued func() int) { sched.LetOthersRun() }

// readyCount is how many answers wait to be sent.
func (ss *servedSession) readyCount() int {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return len(ss.ready)
}

// sendOne writes m; ss.sending is held by the caller and released here.
func (ss *servedSession) sendOne(m *tenurev1.FetchSessionResponse) {
	err := ss.st.Send(m)
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.sending, ss.sent = false, time.Now()
	if err != nil && ss.sendErr == nil {
		ss.sendErr = err
		close(ss.failed)
	}
}

// nextMessageLocked takes the ready answers that fit one message. ss.mu is
// held and ss.ready is not empty.
func (ss *servedSession) nextMessageLocked() *tenurev1.FetchSessionResponse {
	n, size := 0, 0
	for n < len(ss.ready) {
		sz := proto.Size(ss.ready[n]) + 8 // + the field's tag and length
		if n > 0 && size+sz > sessionAnswerBudget {
			break
		}
		n, size = n+1, size+sz
	}
	m := &tenurev1.FetchSessionResponse{Answers: ss.ready[:n:n]}
	ss.ready = ss.ready[n:]
	if len(ss.ready) == 0 {
		ss.ready = nil // let the sent answers' array go
	}
	return m
}

// take applies one message from the follower: its forgets, its heartbeat,
// and a held pull per new pull.
func (ss *servedSession) take(m *tenurev1.FetchSessionRequest) error {
	if len(m.GetPulls()) > wire.MaxSessionPulls || len(m.GetForget()) > wire.MaxSessionPulls {
		return invalidf("a fetch session message carries %d pulls and %d forgets, at most %d each", len(m.GetPulls()), len(m.GetForget()), wire.MaxSessionPulls)
	}
	if m.GetHeartbeatMs() > wire.MaxFetchWaitMillis {
		return invalidf("heartbeat_ms %d is above the limit %d", m.GetHeartbeatMs(), wire.MaxFetchWaitMillis)
	}
	seen := make(map[string]bool, len(m.GetPulls()))
	for _, p := range m.GetPulls() {
		if p.GetFetch() == nil {
			return invalidf("pull %d carries no fetch", p.GetId())
		}
		// The range id is checked again by the pull's fetch; here it is a
		// map key, and two pulls for one range in a message have no order.
		if seen[p.GetFetch().GetRangeId()] {
			return invalidf("range %q is pulled twice in one fetch session message", p.GetFetch().GetRangeId())
		}
		seen[p.GetFetch().GetRangeId()] = true
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.ended {
		return nil
	}
	if hb := m.GetHeartbeatMs(); hb > 0 {
		ss.heartbeat = time.Duration(hb) * time.Millisecond
	}
	for _, id := range m.GetForget() {
		if p := ss.byID[id]; p != nil {
			ss.dropLocked(p)
		}
	}
	for _, pm := range m.GetPulls() {
		if _, dup := ss.byID[pm.GetId()]; dup {
			return invalidf("pull id %d is already held on this fetch session", pm.GetId())
		}
		rangeID := pm.GetFetch().GetRangeId()
		if old := ss.held[rangeID]; old != nil {
			// The follower's newer pull for the range replaces it: the
			// follower no longer waits for the old one's answer.
			ss.dropLocked(old)
		}
		if len(ss.held) >= wire.MaxSessionPulls {
			return invalidf("a fetch session holds at most %d pulls", wire.MaxSessionPulls)
		}
		ctx, cancel := context.WithCancel(ss.pulls)
		p := &heldPull{id: pm.GetId(), rangeID: rangeID, cancel: cancel}
		ss.held[rangeID], ss.byID[p.id] = p, p
		ss.pullsGroup.Add(1)
		go ss.serve(ctx, p, pm.GetFetch())
	}
	return nil
}

// dropLocked forgets a held pull; its fetch returns unanswered. ss.mu is held.
func (ss *servedSession) dropLocked(p *heldPull) {
	p.cancel()
	delete(ss.byID, p.id)
	if ss.held[p.rangeID] == p {
		delete(ss.held, p.rangeID)
	}
}

// serve runs one held pull and queues its answer, unless it was dropped.
func (ss *servedSession) serve(ctx context.Context, p *heldPull, m *tenurev1.FetchRequest) {
	defer ss.pullsGroup.Done()
	a, err := ss.s.fetchUntil(ctx, m, true)
	ss.mu.Lock()
	if ss.byID[p.id] != p || ctx.Err() != nil {
		// Replaced, forgotten, or the session ended: nobody waits for it.
		// (Its offset may have been counted: that is the follower's durable
		// position either way.)
		ss.mu.Unlock()
		return
	}
	ss.dropLocked(p)
	ans := &tenurev1.SessionAnswer{Id: p.id, Fetch: a}
	if err != nil {
		ce := new(connect.Error)
		if !errors.As(toConnect(err), &ce) {
			ce = connect.NewError(connect.CodeInternal, err)
		}
		ans = &tenurev1.SessionAnswer{Id: p.id, ErrorCode: uint32(ce.Code()), ErrorMessage: ce.Message()}
	}
	ss.mu.Unlock()
	ss.post(ans)
}
