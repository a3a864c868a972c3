package transport

import (
	"crypto/tls"
	"net"
	"strings"
	"sync/atomic"

	"github.com/tenurelog/tenure/pkg/auth"
)

// tlsSource is the process's TLS identity (SetTLS), nil for cleartext.
var tlsSource atomic.Pointer[auth.Source]

// SetTLS makes every server this process starts afterwards serve TLS with
// src's certificate and enforce auth.Table on every request, and every
// client it makes afterwards present src's certificate and verify servers
// against src's CA. nil goes back to cleartext. Like SetInterceptors it is
// process-wide, so no server or client can be built without it by
// mistake: a binary calls it once, before anything else, from its flags.
func SetTLS(src *auth.Source) { tlsSource.Store(src) }

// TLS returns the source SetTLS installed, or nil.
func TLS() *auth.Source { return tlsSource.Load() }

// Scheme is the URL scheme this process's servers speak: "https" under
// SetTLS, "http" otherwise.
func Scheme() string {
	if TLS() != nil {
		return "https"
	}
	return "http"
}

// serverTLS wraps ln in TLS and h in the authorisation table when SetTLS
// is on.
func serverTLS(ln net.Listener) (net.Listener, *auth.Source) {
	src := TLS()
	if src == nil {
		return ln, nil
	}
	return tls.NewListener(ln, src.ServerConfig()), src
}

// Loopback reports whether addr (host:port, or a bare host) only listens on
// the loopback interface. A server without TLS refuses anything else unless
// told it is insecure on purpose (auth.ErrNoTLS).
func Loopback(addr string) bool {
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
