package leaseclient

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/internal/testnet"
	"github.com/tenurelog/tenure/internal/tlshint"
	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// Every lease service procedure has a failover rule: a procedure added to
// the service without one would silently never be repeated after an
// unknown outcome, which is safe, but a decision nobody made.
func TestEveryProcedureHasARule(t *testing.T) {
	methods := tenurev1.File_tenure_v1_lease_proto.Services().ByName("LeaseService").Methods()
	for i := range methods.Len() {
		proc := "/" + tenurev1connect.LeaseServiceName + "/" + string(methods.Get(i).Name())
		if _, ok := procedureSafe[proc]; !ok {
			t.Errorf("procedure %s has no failover rule in procedureSafe", proc)
		}
	}
	if len(procedureSafe) != methods.Len() {
		t.Errorf("procedureSafe has %d rules, the service %d procedures", len(procedureSafe), methods.Len())
	}
}

// instance is a lease service instance whose answers the test picks: a
// seam for the outcomes a real instance gives under faults (Unavailable
// when etcd did not answer in time; no answer when frozen).
type instance struct {
	tenurev1connect.UnimplementedLeaseServiceHandler
	calls  atomic.Int32
	answer func(ctx context.Context) error
}

func (s *instance) GetRange(ctx context.Context, _ *connect.Request[tenurev1.GetRangeRequest]) (*connect.Response[tenurev1.GetRangeResponse], error) {
	s.calls.Add(1)
	if err := s.answer(ctx); err != nil {
		return nil, err
	}
	return connect.NewResponse(&tenurev1.GetRangeResponse{Range: &tenurev1.RangeInfo{RangeId: "r"}}), nil
}

func (s *instance) GrantEpoch(ctx context.Context, _ *connect.Request[tenurev1.GrantEpochRequest]) (*connect.Response[tenurev1.GrantEpochResponse], error) {
	s.calls.Add(1)
	if err := s.answer(ctx); err != nil {
		return nil, err
	}
	return connect.NewResponse(&tenurev1.GrantEpochResponse{Epoch: 1}), nil
}

func serve(t *testing.T, answer func(context.Context) error) (*instance, string) {
	t.Helper()
	s := &instance{answer: answer}
	path, h := tenurev1connect.NewLeaseServiceHandler(s, transport.HandlerOptions()...)
	srv, err := transport.Serve("127.0.0.1:0", transport.Registration{Name: tenurev1connect.LeaseServiceName, Path: path, Handler: h})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return s, srv.URL()
}

func ok(context.Context) error { return nil }

func unavailable(context.Context) error {
	return connect.NewError(connect.CodeUnavailable, errors.New("etcd did not answer in time"))
}

func TestFailover(t *testing.T) {
	getRange := func(c *Client) error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := c.GetRange(ctx, connect.NewRequest(&tenurev1.GetRangeRequest{RangeId: "r"}))
		return err
	}
	grant := func(c *Client) error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := c.GrantEpoch(ctx, connect.NewRequest(&tenurev1.GrantEpochRequest{RangeId: "r", PreviousEpoch: 0}))
		return err
	}
	frozen := func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
	for _, tt := range []struct {
		name string
		// first is the first instance's answer, "" for a dead instance.
		first    func(context.Context) error
		call     func(*Client) error
		wantCode connect.Code // 0: success
		// wantSecond: the call reached the second instance.
		wantSecond bool
	}{
		// Never sent: any call goes on, a grant too.
		{name: "dead first, read", call: getRange, wantSecond: true},
		{name: "dead first, grant", call: grant, wantSecond: true},
		// Unavailable: the outcome is unknown. A read goes on; a grant is
		// the caller's to decide (it may have applied).
		{name: "unavailable first, read", first: unavailable, call: getRange, wantSecond: true},
		{name: "unavailable first, grant", first: unavailable, call: grant, wantCode: connect.CodeUnavailable},
		// A frozen instance: a read gets half the deadline there and the
		// rest on the second; a grant waits out its deadline on the first.
		{name: "frozen first, read", first: frozen, call: getRange, wantSecond: true},
		{name: "frozen first, grant", first: frozen, call: grant, wantCode: connect.CodeDeadlineExceeded},
		// The same, when the deadline Connect passes along ran out on the
		// server before the client's own (a race under load): the answer
		// is deadline_exceeded, and later calls move on too.
		{name: "deadline answered first, grant", first: func(context.Context) error {
			return connect.NewError(connect.CodeDeadlineExceeded, errors.New("the server's copy of the deadline ran out first"))
		}, call: grant, wantCode: connect.CodeDeadlineExceeded},
		// An answer is an answer, also an error one.
		{name: "ok first, read", first: ok, call: getRange},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var firstURL string
			var first *instance
			if tt.first == nil {
				firstURL = "http://" + testnet.ClosedAddr(t)
			} else {
				first, firstURL = serve(t, tt.first)
			}
			second, secondURL := serve(t, ok)
			c, err := New(transport.NewHTTPClient(), []string{firstURL, secondURL})
			if err != nil {
				t.Fatal(err)
			}
			err = tt.call(c)
			if got := connect.CodeOf(err); (err == nil) != (tt.wantCode == 0) || (err != nil && got != tt.wantCode) {
				t.Fatalf("call = %v (code %v), want code %v", err, got, tt.wantCode)
			}
			if got := second.calls.Load() > 0; got != tt.wantSecond {
				t.Errorf("second instance called: %v, want %v", got, tt.wantSecond)
			}
			if first != nil && first.calls.Load() != 1 {
				t.Errorf("first instance called %d times, want once", first.calls.Load())
			}
			// The instance that answered is the first the next call tries.
			want := firstURL
			if tt.wantSecond || tt.wantCode != 0 {
				want = secondURL
			}
			if got := c.Current(); got != want {
				t.Errorf("Current() = %s after the call, want %s", got, want)
			}
		})
	}
}

// TestEveryInstancesFailureIsReported: when no instance answers, the error
// says why each one failed, not only the last: an operator with a TLS
// mismatch on one instance and another instance down was shown only
// "connection refused".
func TestEveryInstancesFailureIsReported(t *testing.T) {
	cleartext, cleartextURL := serve(t, ok) // a cleartext server, called over https below
	dead := testnet.ClosedAddr(t)
	httpsURL := "https://" + strings.TrimPrefix(cleartextURL, "http://")
	c, err := New(transport.NewHTTPClient(), []string{httpsURL, "http://" + dead})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = c.GetRange(ctx, connect.NewRequest(&tenurev1.GetRangeRequest{RangeId: "r"}))
	if err == nil {
		t.Fatal("GetRange() = nil error, want both instances' failures")
	}
	msg := err.Error()
	for _, want := range []string{"server gave HTTP response to HTTPS client", dead, "connection refused"} {
		if !strings.Contains(msg, want) {
			t.Errorf("GetRange() = %v\nwant it to name %q", err, want)
		}
	}
	if !tlshint.CleartextServer(err) {
		t.Errorf("tlshint.CleartextServer(%v) = false, want the hint for the first instance", err)
	}
	if cleartext.calls.Load() != 0 {
		t.Errorf("cleartext instance served %d calls over https", cleartext.calls.Load())
	}
}
