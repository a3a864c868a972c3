package transport

import (
	"context"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// freezer is a listener whose accepted connections can be frozen: a frozen
// connection neither reads nor writes, like a paused container's.
type freezer struct {
	net.Listener
	mu     sync.Mutex
	frozen bool
	thaw   chan struct{}
	conns  []*freezeConn
}

type freezeConn struct {
	net.Conn
	l      *freezer
	frozen bool // set by freezeAll; guarded by l.mu
}

func (l *freezer) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	fc := &freezeConn{Conn: c, l: l}
	l.mu.Lock()
	l.conns = append(l.conns, fc)
	l.mu.Unlock()
	return fc, nil
}

// freezeAll freezes every connection accepted so far; later ones are not.
func (l *freezer) freezeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.frozen = true
	}
}

// wait blocks while c is frozen, until the listener thaws.
func (c *freezeConn) wait() {
	c.l.mu.Lock()
	frozen := c.frozen
	c.l.mu.Unlock()
	if frozen {
		<-c.l.thaw
	}
}

func (c *freezeConn) Read(p []byte) (int, error)  { c.wait(); return c.Conn.Read(p) }
func (c *freezeConn) Write(p []byte) (int, error) { c.wait(); return c.Conn.Write(p) }

// TestFrozenPeerConnectionIsDropped: after a peer stops answering, calls
// to its address do not stay stuck on the old connection; once the ping
// health check closes it, the next call dials a new one and succeeds.
func TestFrozenPeerConnectionIsDropped(t *testing.T) {
	oldAfter, oldTimeout := pingAfter, pingTimeout
	pingAfter, pingTimeout = 200*time.Millisecond, 200*time.Millisecond
	defer func() { pingAfter, pingTimeout = oldAfter, oldTimeout }()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fl := &freezer{Listener: ln, thaw: make(chan struct{})}
	defer close(fl.thaw) // lets the frozen server goroutines finish
	mux := http.NewServeMux()
	mux.Handle("/t.Echo/Unary", connect.NewUnaryHandler("/t.Echo/Unary",
		func(_ context.Context, r *connect.Request[tenurev1.FetchRequest]) (*connect.Response[tenurev1.FetchResponse], error) {
			return connect.NewResponse(&tenurev1.FetchResponse{HighWaterMark: r.Msg.GetFetchOffset()}), nil
		}, HandlerOptions()...))
	srv := ServeListener(fl, Registration{Name: "t.Echo", Path: "/t.Echo/", Handler: mux})
	hc := NewHTTPClient()
	c := connect.NewClient[tenurev1.FetchRequest, tenurev1.FetchResponse](hc, srv.URL()+"/t.Echo/Unary", ClientOptions()...)
	call := func(within time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		_, err := c.CallUnary(ctx, connect.NewRequest(&tenurev1.FetchRequest{FetchOffset: 1}))
		return err
	}
	if err := call(5 * time.Second); err != nil {
		t.Fatalf("first call = %v", err)
	}
	fl.freezeAll()
	// The frozen connection fails this call, by the ping check or the
	// deadline; either way it must not carry the next one.
	_ = call(2 * time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := call(time.Second)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("calls still fail 10 s after the peer froze (last: %v): the frozen connection was kept", err)
		}
	}
	hc.CloseIdleConnections()
	_ = srv.Close()
}
