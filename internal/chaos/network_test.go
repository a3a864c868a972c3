package chaos

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/internal/chaos/workload"
	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// The Network's faults on a real HTTP/2 cleartext Connect server: node "b"
// serves an echo stream (answer = request's fetch offset, as the epoch) and
// an echo unary call through Network.Handler("b"), and node "a" calls it
// through Network.Client("a").

const (
	echoStreamPath = "/chaos.test.Echo/EchoStream"
	echoUnaryPath  = "/chaos.test.Echo/Echo"
	// bound is how long any wait in these tests may take.
	bound = 5 * time.Second
	// quiet is how long an answer must not come while it is held.
	quiet = 300 * time.Millisecond
)

type echoEnv struct {
	n      *Network
	url    string
	stream *connect.Client[tenurev1.FetchStreamRequest, tenurev1.FetchStreamResponse]
	unary  *connect.Client[tenurev1.FetchRequest, tenurev1.FetchResponse]
}

func startEcho(t *testing.T) *echoEnv {
	t.Helper()
	n := NewNetwork(1)
	streamH := connect.NewBidiStreamHandler(echoStreamPath, func(ctx context.Context, st *connect.BidiStream[tenurev1.FetchStreamRequest, tenurev1.FetchStreamResponse]) error {
		for {
			m, err := st.Receive()
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return err
			}
			if err := st.Send(&tenurev1.FetchStreamResponse{Fetch: &tenurev1.FetchResponse{Epoch: m.GetFetch().GetFetchOffset()}}); err != nil {
				return err
			}
		}
	}, transport.HandlerOptions()...)
	unaryH := connect.NewUnaryHandler(echoUnaryPath, func(ctx context.Context, r *connect.Request[tenurev1.FetchRequest]) (*connect.Response[tenurev1.FetchResponse], error) {
		return connect.NewResponse(&tenurev1.FetchResponse{Epoch: r.Msg.GetFetchOffset()}), nil
	}, transport.HandlerOptions()...)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := transport.ServeListener(ln,
		transport.Registration{Name: "chaos.test.EchoStream", Path: echoStreamPath, Handler: n.Handler("b", streamH)},
		transport.Registration{Name: "chaos.test.Echo", Path: echoUnaryPath, Handler: n.Handler("b", unaryH)},
	)
	t.Cleanup(func() {
		n.Resume("a")
		n.Resume("b")
		_ = srv.Close()
	})
	n.Register("b", srv.Addr)
	hc := n.Client("a")
	return &echoEnv{
		n:      n,
		url:    srv.URL(),
		stream: connect.NewClient[tenurev1.FetchStreamRequest, tenurev1.FetchStreamResponse](hc, srv.URL()+echoStreamPath, transport.ClientOptions()...),
		unary:  connect.NewClient[tenurev1.FetchRequest, tenurev1.FetchResponse](hc, srv.URL()+echoUnaryPath, transport.ClientOptions()...),
	}
}

type echoStream struct {
	st     *connect.BidiStreamForClient[tenurev1.FetchStreamRequest, tenurev1.FetchStreamResponse]
	cancel context.CancelFunc
}

func (e *echoEnv) open(t *testing.T) *echoStream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*bound)
	s := &echoStream{st: e.stream.CallBidiStream(ctx), cancel: cancel}
	t.Cleanup(func() {
		cancel()
		_ = s.st.CloseRequest()
		_ = s.st.CloseResponse()
	})
	return s
}

type answer struct {
	v   uint64
	err error
}

// ask sends offset v on the stream and returns a channel for its answer.
func (s *echoStream) ask(v uint64) <-chan answer {
	ch := make(chan answer, 1)
	go func() {
		err := s.st.Send(&tenurev1.FetchStreamRequest{Fetch: &tenurev1.FetchRequest{FetchOffset: v}})
		if err != nil && !errors.Is(err, io.EOF) {
			ch <- answer{err: err}
			return
		}
		// On io.EOF the stream failed; Receive returns why.
		m, err := s.st.Receive()
		if err != nil {
			ch <- answer{err: err}
			return
		}
		ch <- answer{v: m.GetFetch().GetEpoch()}
	}()
	return ch
}

// roundTrip asks v and requires its echo within bound.
func (s *echoStream) roundTrip(t *testing.T, v uint64) {
	t.Helper()
	select {
	case a := <-s.ask(v):
		if a.err != nil || a.v != v {
			t.Fatalf("round trip %d: got %d, %v", v, a.v, a.err)
		}
	case <-time.After(bound):
		t.Fatalf("round trip %d: no answer within %v", v, bound)
	}
}

// requireHeld requires no answer on ch for quiet, then returns.
func requireHeld(t *testing.T, ch <-chan answer, what string) {
	t.Helper()
	select {
	case a := <-ch:
		t.Fatalf("%s: answered while paused: %d, %v", what, a.v, a.err)
	case <-time.After(quiet):
	}
}

// requireAnswer requires the echo v on ch within bound.
func requireAnswer(t *testing.T, ch <-chan answer, v uint64, what string) {
	t.Helper()
	select {
	case a := <-ch:
		if a.err != nil || a.v != v {
			t.Fatalf("%s: got %d, %v; want %d", what, a.v, a.err, v)
		}
	case <-time.After(bound):
		t.Fatalf("%s: no answer within %v", what, bound)
	}
}

// requireFailure requires an error on ch within bound.
func requireFailure(t *testing.T, ch <-chan answer, what string) error {
	t.Helper()
	select {
	case a := <-ch:
		if a.err == nil {
			t.Fatalf("%s: answered %d, want an error", what, a.v)
		}
		return a.err
	case <-time.After(bound):
		t.Fatalf("%s: neither answer nor error within %v", what, bound)
	}
	return nil
}

func (e *echoEnv) call(v uint64) (uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	resp, err := e.unary.CallUnary(ctx, connect.NewRequest(&tenurev1.FetchRequest{FetchOffset: v}))
	if err != nil {
		return 0, err
	}
	return resp.Msg.GetEpoch(), nil
}

// A paused server answers nothing on a stream opened before the pause, and
// answers it after Resume: the zombie leader that, before per-message
// gates, kept answering its followers' fetches on their open streams.
func TestNetworkPauseHoldsOpenStream(t *testing.T) {
	// The echo stream runs from client node "a" to server node "b". A paused
	// client neither sends on nor reads from its open streams.
	for _, tc := range []struct{ name, node string }{{"server", "b"}, {"client", "a"}} {
		t.Run(tc.name, func(t *testing.T) {
			e := startEcho(t)
			s := e.open(t)
			s.roundTrip(t, 1)
			e.n.Pause(tc.node)
			ch := s.ask(2)
			requireHeld(t, ch, "paused "+tc.name)
			e.n.Resume(tc.node)
			requireAnswer(t, ch, 2, "resumed "+tc.name)
			s.roundTrip(t, 3)
		})
	}
}

// A cut breaks a stream opened before it, and refuses new ones until Heal.
func TestNetworkCutBreaksOpenStream(t *testing.T) {
	t.Run("cut", func(t *testing.T) {
		e := startEcho(t)
		s := e.open(t)
		s.roundTrip(t, 1)
		e.n.Cut("a", "b")
		requireFailure(t, s.ask(2), "stream across a cut")
		err := requireFailure(t, e.open(t).ask(3), "stream opened across a cut")
		if !errors.Is(err, workload.ErrNotSent) {
			t.Errorf("stream opened across a cut: %v, want an error wrapping ErrNotSent", err)
		}
		e.n.Heal()
		e.open(t).roundTrip(t, 4)
	})
	t.Run("cancel raced", func(t *testing.T) {
		// The pair is cut without cancelling what is in flight, as if the
		// stream opened just after Cut's cancel: its bodies' reads must
		// still refuse to carry a message across.
		e := startEcho(t)
		s := e.open(t)
		s.roundTrip(t, 1)
		e.n.mu.Lock()
		e.n.cut[[2]string{"a", "b"}] = true
		e.n.cut[[2]string{"b", "a"}] = true
		e.n.mu.Unlock()
		err := requireFailure(t, s.ask(2), "stream across a cut without cancel")
		t.Logf("error on a stream across a cut: %v", err)
	})
}

// Flaky faults hit every message of a stream, about as often per request
// and answer as they hit a unary call.
func TestNetworkFlakyPerMessage(t *testing.T) {
	const trips = 200
	e := startEcho(t)
	e.n.Flaky(0.2, 0)
	streamLost := 0
	s := e.open(t)
	for i := range uint64(trips) {
		select {
		case a := <-s.ask(i):
			if a.err != nil {
				streamLost++
				s.cancel()
				s = e.open(t) // a lost message ends the stream
			} else if a.v != i {
				t.Fatalf("round trip %d: got %d", i, a.v)
			}
		case <-time.After(bound):
			t.Fatalf("round trip %d: no answer within %v", i, bound)
		}
	}
	unaryLost := 0
	for i := range uint64(trips) {
		if v, err := e.call(i); err != nil {
			unaryLost++
		} else if v != i {
			t.Fatalf("unary %d: got %d", i, v)
		}
	}
	// Both lose 1-(0.9)^2 = 19% (38 of 200) on average.
	t.Logf("lost at drop 0.2: stream %d/%d round trips, unary %d/%d calls", streamLost, trips, unaryLost, trips)
	for _, lost := range []int{streamLost, unaryLost} {
		if lost < 15 || lost > 70 {
			t.Errorf("lost %d of %d, want about 38", lost, trips)
		}
	}

	// Delays: each direction of a stream message is held up to delay/2.
	e.n.Flaky(0, 100*time.Millisecond)
	s = e.open(t)
	start := time.Now()
	for i := range uint64(20) {
		s.roundTrip(t, i)
	}
	if took := time.Since(start); took < 300*time.Millisecond || took > 4*time.Second {
		t.Errorf("20 round trips with up to 2x50ms of delay took %v, want about 1s", took)
	}
	e.n.Heal()
}

// Unary calls behave as they always did: a paused server holds a new call
// until Resume, a cut refuses it before sending, Sent counts one per call,
// and a certain drop loses every call.
func TestNetworkUnary(t *testing.T) {
	e := startEcho(t)
	if v, err := e.call(7); err != nil || v != 7 {
		t.Fatalf("unary: %d, %v", v, err)
	}
	e.n.mu.Lock()
	sent, faulted := e.n.Sent, e.n.Faulted
	e.n.mu.Unlock()
	if sent != 1 || faulted != 0 {
		t.Errorf("after one clean call: Sent %d Faulted %d, want 1 and 0", sent, faulted)
	}

	e.n.Pause("b")
	ch := make(chan answer, 1)
	go func() { v, err := e.call(8); ch <- answer{v, err} }()
	requireHeld(t, ch, "unary to a paused server")
	e.n.Resume("b")
	requireAnswer(t, ch, 8, "unary after Resume")

	e.n.Cut("a", "b")
	if _, err := e.call(9); !errors.Is(err, workload.ErrNotSent) {
		t.Errorf("unary across a cut: %v, want an error wrapping ErrNotSent", err)
	}
	e.n.Heal()

	e.n.Flaky(2, 0) // drop/2 = 1: every call is lost before sending
	if _, err := e.call(10); !errors.Is(err, workload.ErrNotSent) {
		t.Errorf("unary at certain drop: %v, want an error wrapping ErrNotSent", err)
	}
	e.n.Heal()
	if v, err := e.call(11); err != nil || v != 11 {
		t.Fatalf("unary after Heal: %d, %v", v, err)
	}
}
