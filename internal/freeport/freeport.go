// Package freeport binds loopback listeners on ports below the kernel's
// ephemeral range, for servers that are stopped and started again on the
// same port: the embedded etcd (pkg/embedetcd, also under `tenure dev`) and
// the replicas and etcd members of test clusters.
//
// A port from ":0" lies in the ephemeral range (Linux:
// /proc/sys/net/ipv4/ip_local_port_range, 32768-60999 by default), which the
// kernel also hands out as the local port of every outgoing connection and
// to every other ":0" listener. While its server is stopped, anyone's
// connection may take it, and the restart then fails with "address already
// in use" (embedetcd's Restart did, in CI). A port below the range is taken
// by nobody but a listener that asks for that very port, so it stays free
// while its server is down, and a connection to it is refused.
package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// tries bounds the random ports Listen tries below the ephemeral range
// before it settles for one from the kernel (":0"). With the default range
// that is 64 of 16384 ports; taken ones are rare, so more tries would only
// delay the fallback.
const tries = 64

// minLow is the lowest start of the ephemeral range under which Listen
// picks ports itself: below it, the ports under the range are the
// privileged and well-known ones, and ":0" is the better choice.
const minLow = 2048

// Listen binds a free loopback port drawn at random from the upper half of
// the ports below the ephemeral range (16384-32767 under Linux's default
// range; the lower half holds the ports services are usually configured
// on). It falls back to "127.0.0.1:0" when the range cannot be read (not
// Linux), starts below 2048, or every try is taken.
func Listen() (net.Listener, error) {
	low := ephemeralLow()
	if low < minLow {
		return net.Listen("tcp", "127.0.0.1:0")
	}
	return listenIn(low/2, low)
}

// listenIn binds a loopback port drawn at random from [lo, hi), trying at
// most tries ports, then ":0".
func listenIn(lo, hi int) (net.Listener, error) {
	for range tries {
		port := lo + rand.IntN(hi-lo)
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			return ln, nil
		}
		// Only a taken port is worth another draw; any other failure
		// (out of descriptors, say) would fail every draw alike, and ":0"
		// reports it.
		if !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	return net.Listen("tcp", "127.0.0.1:0")
}

// ephemeralLow is the first port of the kernel's ephemeral range, or 0 when
// it cannot be read. Read once: the range changes only when an
// administrator sets it, and Listen runs for every server a test starts.
var ephemeralLow = sync.OnceValue(func() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	fields := strings.Fields(string(b))
	if len(fields) != 2 {
		return 0
	}
	low, err := strconv.Atoi(fields[0])
	if err != nil {
		return 0
	}
	return low
})
