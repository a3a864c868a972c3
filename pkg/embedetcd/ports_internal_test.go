package embedetcd

import (
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
)

// The member's ports lie below the kernel's ephemeral range: a port Stop
// released can then be taken by nobody but a listener on that very port,
// not by any outgoing connection or ":0" listener of another test, which
// made Restart fail with "address already in use" in CI. Where the range
// cannot be read (not Linux), any free port will do.
func TestPortsAreBelowTheEphemeralRange(t *testing.T) {
	e, err := Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	// Read here rather than through internal/freeport, so the test checks
	// the kernel's range, not freeport's reading of it.
	low := 0
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			low, _ = strconv.Atoi(f[0])
		}
	}
	for _, u := range []url.URL{e.clientURL, e.peerURL} {
		port, err := strconv.Atoi(u.Port())
		switch {
		case err != nil || port <= 0:
			t.Errorf("member listens on %s, want a port", u.Host)
		case low >= 2048 && (port >= low || port < low/2):
			t.Errorf("member listens on %s, want a port in [%d, %d), below the ephemeral range", u.Host, low/2, low)
		}
	}
	if e.clientURL == e.peerURL {
		t.Errorf("client and peer share %s", e.clientURL.Host)
	}
}
