package promoter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/transport"
)

// A probe whose connection broke (the replica died mid-probe) is asked
// again at once; a slow or erroring replica is not.
func TestConnectionLost(t *testing.T) {
	wrapped := func(err error) error {
		return connect.NewError(connect.CodeCanceled, &url.Error{Op: "Post", URL: "http://127.0.0.1:1/x",
			Err: &net.OpError{Op: "write", Net: "tcp", Err: err}})
	}
	for name, tc := range map[string]struct {
		err  error
		lost bool
	}{
		"broken pipe":       {wrapped(os.NewSyscallError("write", syscall.EPIPE)), true},
		"reset":             {wrapped(os.NewSyscallError("read", syscall.ECONNRESET)), true},
		"eof":               {connect.NewError(connect.CodeUnknown, io.ErrUnexpectedEOF), true},
		"deadline":          {connect.NewError(connect.CodeDeadlineExceeded, context.DeadlineExceeded), false},
		"answered an error": {connect.NewError(connect.CodeNotFound, errors.New("range not hosted")), false},
	} {
		if got := connectionLost(tc.err); got != tc.lost {
			t.Errorf("%s: connectionLost(%v) = %v, want %v", name, tc.err, got, tc.lost)
		}
	}
}

// Only errors that show no process serves the address are taken as death;
// a request or answer lost on the way is a missed probe.
func TestPeerGone(t *testing.T) {
	dial := func(err error) error {
		return connect.NewError(connect.CodeUnavailable, &url.Error{Op: "Post", URL: "http://127.0.0.1:1/x",
			Err: &net.OpError{Op: "dial", Net: "tcp", Err: err}})
	}
	for name, tc := range map[string]struct {
		err  error
		gone bool
	}{
		"refused":        {dial(os.NewSyscallError("connect", syscall.ECONNREFUSED)), true},
		"name not found": {dial(&net.DNSError{Err: "no such host", Name: "replica-1", IsNotFound: true}), true},
		"reset":          {dial(os.NewSyscallError("read", syscall.ECONNRESET)), true},
		"dns outage":     {dial(&net.DNSError{Err: "server misbehaving", Name: "replica-1", IsTemporary: true}), false},
		"no route":       {dial(os.NewSyscallError("connect", syscall.EHOSTUNREACH)), false},
		"lost on a link": {connect.NewError(connect.CodeUnavailable, errors.New("request not sent: request p1 -> r1 lost")), false},
		"deadline":       {connect.NewError(connect.CodeDeadlineExceeded, context.DeadlineExceeded), false},
		"no error":       {nil, false},
	} {
		if got := peerGone(tc.err); got != tc.gone {
			t.Errorf("%s: peerGone(%v) = %v, want %v", name, tc.err, got, tc.gone)
		}
	}
}

// A leader whose probes are lost on the way, while it still renews its
// lease, keeps its epoch: lost probes are misses, and misses promote only
// once the lease is no longer live. (Every lost probe used to count as a
// refused connection and promote at once.) Killed, it is replaced at once.
func TestLostProbesDoNotDeposeALeasedLeader(t *testing.T) {
	c := newCluster(t, 3)
	c.createRange("r", "r1")
	var drop atomic.Pointer[string] // the address whose probes are lost
	base := transport.NewHTTPClient()
	t.Cleanup(base.CloseIdleConnections)
	hc := &http.Client{Transport: roundTripFunc(func(req *http.Request) (*http.Response, error) {
		if a := drop.Load(); a != nil && req.URL.Host == *a && strings.HasSuffix(req.URL.Path, "/GetStatus") {
			if req.Body != nil {
				_ = req.Body.Close()
			}
			return nil, errors.New("test: probe lost on the way")
		}
		return base.Transport.RoundTrip(req)
	})}
	p := c.newPromoter("p1", true, func(cfg *Config) { cfg.HTTPClient = hc })
	leader, epoch := c.leader("r", 1, 20*time.Second)
	waitFor(t, "the leader's lease to be valid", 10*time.Second, func() bool { return c.status(leader, "r").GetLeaseValid() })

	addr := strings.TrimPrefix(c.byID[leader].srv.URL(), "http://")
	drop.Store(&addr)
	// Many times ProbeMisses (3) x ProbeInterval (100ms).
	time.Sleep(2 * time.Second)
	if l, e := c.leader("r", 1, 10*time.Second); l != leader || e != epoch {
		t.Fatalf("after 2s of lost probes the range is led by %s at epoch %d, want %s still at epoch %d", l, e, leader, epoch)
	}
	if _, err := c.appendOne("r", "still leading", 10*time.Second); err != nil {
		t.Fatal(err)
	}

	// A dead leader refuses connections: replaced without waiting for its
	// lease (the probes to its address are still lost; another's are not).
	drop.Store(nil)
	c.stop(c.byID[leader])
	l, e := c.leader("r", epoch+1, 20*time.Second)
	if l == leader {
		t.Fatalf("the killed leader %s still leads at epoch %d", l, e)
	}
	// The transition record names the leader that was lost, not only its
	// address.
	var reason string
	waitFor(t, "the transition record of epoch "+fmt.Sprint(e), 10*time.Second, func() bool {
		trs, err := p.transitions(context.Background(), "r", 1)
		if err != nil || len(trs) == 0 || trs[0].GetEpoch() != e {
			return false
		}
		reason = trs[0].GetReason()
		return true
	})
	if want := "leader " + leader + " unreachable: "; !strings.HasPrefix(reason, want) {
		t.Errorf("reason of the failover = %q, want it to start with %q", reason, want)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
