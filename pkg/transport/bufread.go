package transport

import (
	"bufio"
	"net"
)

// bufferedReadBytes is the read buffer of each cleartext server connection:
// room for a burst of small frames (an append stream's messages, a fetch
// session's pulls) in one read.
const bufferedReadBytes = 16 << 10

// bufferedReads gives every connection the listener accepts a read buffer.
//
// net/http's HTTP/2 server reads frames straight from the connection it
// serves: a frame's 9-byte header is one read(2), its payload another, and
// the read that finds nothing more a third (EAGAIN, then a park). Its client
// reads through a bufio.Reader; the server does not. Over TLS the record
// layer buffers, but over cleartext HTTP/2, tenure's default, every message
// between replicas and every streamed append cost three system calls to
// receive: 12.2 reads per acknowledged record at 100 ranges (perf stat of
// BenchmarkTenureManyRanges), 6.2 with this buffer, which takes every frame
// the kernel holds in one read.
//
// Only for cleartext: a TLS listener's connections must stay *tls.Conn for
// net/http to find their handshake state, and they are buffered already.
func bufferedReads(ln net.Listener) net.Listener { return bufferedListener{ln} }

type bufferedListener struct{ net.Listener }

func (l bufferedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &bufferedConn{Conn: c, r: bufio.NewReaderSize(c, bufferedReadBytes)}, nil
}

// bufferedConn is a connection whose reads go through r; everything else
// (writes, deadlines, Close) is the connection's own.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite keeps what net/http does with a *net.TCPConn: it half-closes an
// HTTP/1 connection before closing it, so the client reads the response
// rather than a reset.
func (c *bufferedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
