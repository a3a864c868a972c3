package freeport

import (
	"net"
	"testing"
)

// When every port of the range is taken, listenIn gives up after its
// bounded tries and takes one from the kernel, rather than failing or
// spinning.
func TestListenInFallsBackWhenTheRangeIsTaken(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	port := taken.Addr().(*net.TCPAddr).Port
	ln, err := listenIn(port, port+1)
	if err != nil {
		t.Fatalf("listenIn(%d, %d) = %v, want the fallback's listener", port, port+1, err)
	}
	defer ln.Close()
	if got := ln.Addr().(*net.TCPAddr).Port; got == port || got <= 0 {
		t.Errorf("listenIn(%d, %d) bound port %d, want another free port", port, port+1, got)
	}
}

// A free port in the range is the one listenIn binds.
func TestListenInBindsAFreePortOfTheRange(t *testing.T) {
	// From Listen, not ":0": a port of the ephemeral range could be taken
	// by another process between the probe's close and listenIn.
	probe, err := Listen()
	if err != nil {
		t.Fatal(err)
	}
	port := probe.Addr().(*net.TCPAddr).Port
	probe.Close()
	ln, err := listenIn(port, port+1)
	if err != nil {
		t.Fatalf("listenIn(%d, %d) = %v, want a listener", port, port+1, err)
	}
	defer ln.Close()
	if got := ln.Addr().(*net.TCPAddr).Port; got != port {
		t.Errorf("listenIn(%d, %d) bound port %d, want %d", port, port+1, got, port)
	}
}
