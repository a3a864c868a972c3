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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + ln.Addr().String()
	ln.Close()
	// As replica-1 of a compose stack is, seen from the host; the same
	// *net.DNSError a real NXDOMAIN answer gives.
	unresolvable := "replica-1." + strings.Repeat("x", 64)
	empty, no := "", false
	c := newClients(clusterOpts{lease: &refused, promoter: &refused, json: &no, cacert: &empty, cert: &empty, key: &empty})
	defer c.close()
	info := &tenurev1.RangeInfo{RangeId: "orders", Epoch: 1, Replicas: []*tenurev1.Replica{
		{Id: "replica-1", Address: "http://" + unresolvable + ":7100"},
		{Id: "r2", Address: refused},
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out bytes.Buffer
	if err := writeStatusTable(&out, []rangeStatus{{info: info, members: c.memberStatuses(ctx, info)}}); err != nil {
		t.Fatal(err)
	}
	wantLines(t, "status", out.String(),
		"replica-1 unreachable - - - - - - host "+unresolvable+" does not resolve here (hint below)",
		"r2 unreachable - - - - - - unreachable",
		"hint: host "+unresolvable+" does not resolve from here.",
	)
	if got := out.String(); !strings.Contains(got, "make ctl ARGS=status") || strings.Contains(got, "hosts") {
		t.Errorf("status =\n%s\nwant one host in the hint, and where to run tenurectl", got)
	}
}

// Where other members' names resolve (make ctl on the stack's network),
// a name that does not is a replica whose container stopped (docker's DNS
// drops its name): the row says so, and no hint sends the operator to run
// tenurectl on the network they are on. It used to give the hint.
func TestStatusOnTheNetworkSaysAnUnresolvedMemberIsGone(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close()
	refused := "http://127.0.0.1:" + port
	unresolvable := "replica-1." + strings.Repeat("x", 64)
	empty, no := "", false
	c := newClients(clusterOpts{lease: &refused, promoter: &refused, json: &no, cacert: &empty, cert: &empty, key: &empty})
	defer c.close()
	info := &tenurev1.RangeInfo{RangeId: "orders", Epoch: 1, Replicas: []*tenurev1.Replica{
		{Id: "replica-1", Address: "http://" + unresolvable + ":7100"},
		// A name that resolves (here to loopback, where nothing listens
		// on the port): its lookup worked.
		{Id: "replica-2", Address: "http://localhost:" + port},
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out bytes.Buffer
	if err := writeStatusTable(&out, []rangeStatus{{info: info, members: c.memberStatuses(ctx, info)}}); err != nil {
		t.Fatal(err)
	}
	wantLines(t, "status", out.String(),
		"replica-1 unreachable - - - - - - host "+unresolvable+" does not resolve, while other members' names do: its container stopped or removed?")
	if got := out.String(); strings.Contains(got, "hint:") {
		t.Errorf("status =\n%s\nwant no hint to run tenurectl elsewhere", got)
	}
}
