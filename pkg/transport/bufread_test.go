package transport_test

import (
	"net"
	"net/http"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// countingListener counts the reads made on the connections it accepts:
// what the server asks of the kernel, under any buffering it adds.
type countingListener struct {
	net.Listener
	reads atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, reads: &l.reads}, nil
}

type countingConn struct {
	net.Conn
	reads *atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	c.reads.Add(1)
	return c.Conn.Read(p)
}

// TestCleartextServerReadsFramesInBulk pins bufferedReads: net/http's HTTP/2
// server reads each frame's header and payload with a read each, so a unary
// call (a HEADERS and a DATA frame) cost at least four reads of the
// connection. Buffered, a read takes every frame that has arrived: at most
// one per frame, usually one per call.
func TestCleartextServerReadsFramesInBulk(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: ln}
	mux := http.NewServeMux()
	mux.Handle("/bench.Echo/Unary", connect.NewUnaryHandler("/bench.Echo/Unary", echoUnary, transport.HandlerOptions()...))
	srv := transport.ServeListener(cl, transport.Registration{Name: "bench.Echo", Path: "/bench.Echo/", Handler: mux})
	t.Cleanup(func() { _ = srv.Close() })
	hc := transport.NewHTTPClient()
	t.Cleanup(hc.CloseIdleConnections)
	c := connect.NewClient[tenurev1.FetchRequest, tenurev1.FetchResponse](hc, srv.URL()+"/bench.Echo/Unary", transport.ClientOptions()...)

	call := func(i int) {
		t.Helper()
		res, err := c.CallUnary(t.Context(), connect.NewRequest(&tenurev1.FetchRequest{FetchOffset: uint64(i)}))
		if err != nil {
			t.Fatal(err)
		}
		if got := res.Msg.GetHighWaterMark(); got != uint64(i) {
			t.Fatalf("call %d answered %d", i, got)
		}
	}
	call(0) // the connection's preface and settings are not what is measured
	before := cl.reads.Load()
	const calls = 100
	for i := 1; i <= calls; i++ {
		call(i)
	}
	perCall := float64(cl.reads.Load()-before) / calls
	t.Logf("%.2f reads of the connection per unary call", perCall)
	// Two frames per call; unbuffered that is four reads, buffered at most
	// two (the frames may arrive in separate segments) plus the odd
	// WINDOW_UPDATE or PING.
	if perCall >= 3 {
		t.Fatalf("%.2f reads per unary call: the server reads each frame's header and payload separately (want < 3)", perCall)
	}
}
