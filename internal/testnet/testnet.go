// Package testnet holds network helpers tests share.
package testnet

import (
	"net"
	"testing"
)

// ClosedAddr is a loopback HOST:PORT where nothing listens: a port bound
// and closed again, so connections to it are refused (until the kernel
// hands the port out again, which a test's lifetime does not reach).
func ClosedAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}
