package freeport_test

import (
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tenurelog/tenure/internal/freeport"
)

// kernelEphemeralLow is the first port of the kernel's ephemeral range, or
// 0 when it cannot be read. Read here rather than through the package, so
// the test checks the kernel's range, not the package's reading of it.
func kernelEphemeralLow(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		t.Fatalf("ip_local_port_range = %q, want two ports", b)
	}
	low, err := strconv.Atoi(f[0])
	if err != nil {
		t.Fatalf("ip_local_port_range = %q: %v", b, err)
	}
	return low
}

// Listen's ports lie below the ephemeral range, where no outgoing
// connection or ":0" listener can take them while their server is down.
// A ":0" port fails this at once: it comes from the range itself. Where
// the range cannot be read (not Linux), any free port will do.
func TestListenIsBelowTheEphemeralRange(t *testing.T) {
	low := kernelEphemeralLow(t)
	// Enough draws that a ":0" fallback slipping through would show, few
	// enough to hold them all open at once.
	const n = 32
	start := time.Now()
	seen := map[int]bool{}
	for range n {
		ln, err := freeport.Listen()
		if err != nil {
			t.Fatalf("Listen() = %v, want a listener", err)
		}
		defer ln.Close()
		addr := ln.Addr().(*net.TCPAddr)
		switch {
		case !addr.IP.IsLoopback():
			t.Errorf("Listen() bound %s, want loopback", addr)
		case addr.Port <= 0:
			t.Errorf("Listen() bound %s, want a port", addr)
		case low >= 2048 && (addr.Port >= low || addr.Port < low/2):
			t.Errorf("Listen() bound %s, want a port in [%d, %d), below the ephemeral range", addr, low/2, low)
		case seen[addr.Port]:
			t.Errorf("Listen() bound %s twice while the first was open", addr)
		}
		seen[addr.Port] = true
	}
	// A draw is one bind; a slow Listen is one retrying far too often.
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("%d Listen() calls took %v, want well under 5s", n, d)
	}
}

// A port Listen gave out, once closed, can be bound again on the same
// address: what a restarted server does.
func TestListenPortCanBeBoundAgain(t *testing.T) {
	ln, err := freeport.Listen()
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("net.Listen(%s) after close = %v, want the port free again", addr, err)
	}
	again.Close()
}
