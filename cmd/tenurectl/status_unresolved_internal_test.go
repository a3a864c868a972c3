// The pure Go resolver answers a name that is not a domain name (a label
// over 63 bytes) "no such host" without asking a DNS server: the test's
// unresolvable host sends nothing off the machine.
//go:debug netdns=go

package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// tenurectl run on the host against a compose stack dials replica-1, which
// only the stack's network resolves: the row must say that the host does
// not resolve and a hint below the table where to run tenurectl, where it
// used to read "unreachable" like a dead replica. A member that refuses
// connections gets no such hint.
func TestStatusHintsAtUnresolvableHosts(t *testing.T) {
	refused := closedPort(t)
	out := statusOf(t, []*tenurev1.Replica{
		{Id: "replica-1", Address: "http://" + unresolvable + ":7100"},
		{Id: "r2", Address: "http://127.0.0.1:" + refused},
	})
	wantLines(t, "status", out,
		"replica-1 unreachable - - - - - - host "+unresolvable+" does not resolve here (hint below)",
		"r2 unreachable - - - - - - unreachable",
		"hint: host "+unresolvable+" does not resolve from here.",
	)
	if !strings.Contains(out, "make ctl ARGS=status") || strings.Contains(out, "hosts") {
		t.Errorf("status =\n%s\nwant one host in the hint, and where to run tenurectl", out)
	}
}

// Where other members' names resolve (make ctl on the stack's network),
// a name that does not is a replica whose container stopped (docker's DNS
// drops its name): the row says so, and no hint sends the operator to run
// tenurectl on the network they are on. It used to give the hint.
func TestStatusOnTheNetworkSaysAnUnresolvedMemberIsGone(t *testing.T) {
	out := statusOf(t, []*tenurev1.Replica{
		{Id: "replica-1", Address: "http://" + unresolvable + ":7100"},
		// A name that resolves (here to loopback, where nothing listens
		// on the port): its lookup worked.
		{Id: "replica-2", Address: "http://localhost:" + closedPort(t)},
	})
	wantLines(t, "status", out,
		"replica-1 unreachable - - - - - - host "+unresolvable+" does not resolve, while other members' names do: its container stopped or removed?")
	if strings.Contains(out, "hint:") {
		t.Errorf("status =\n%s\nwant no hint to run tenurectl elsewhere", out)
	}
}

// unresolvable is a host name as replica-1 of a compose stack is, seen from
// the host; the same *net.DNSError a real NXDOMAIN answer gives.
var unresolvable = "replica-1." + strings.Repeat("x", 64)

// closedPort is a loopback port nothing listens on.
func closedPort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close()
	return port
}

// statusOf is the status table of one range of these members, asked for
// real (the lease service and promoter are closed ports: not asked here).
func statusOf(t *testing.T, members []*tenurev1.Replica) string {
	t.Helper()
	none := "http://127.0.0.1:" + closedPort(t)
	empty, no := "", false
	c := newClients(clusterOpts{lease: &none, promoter: &none, json: &no, cacert: &empty, cert: &empty, key: &empty})
	defer c.close()
	info := &tenurev1.RangeInfo{RangeId: "orders", Epoch: 1, Replicas: members}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out bytes.Buffer
	if err := writeStatusTable(&out, []rangeStatus{{info: info, members: c.memberStatuses(ctx, info)}}); err != nil {
		t.Fatal(err)
	}
	return out.String()
}
