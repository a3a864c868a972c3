package lease_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/embedetcd"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
	"github.com/tenurelog/tenure/services/lease"
	"github.com/tenurelog/tenure/services/lease/leasetest"
)

// sharedEtcd serves every test that does not stop or restart etcd; each
// such test has its own key prefix, so they cannot see each other's ranges.
var sharedEtcd *embedetcd.Etcd

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "lease-test-etcd-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		sharedEtcd, err = embedetcd.Start(dir)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer sharedEtcd.Close()
		return m.Run()
	}())
}

// ttlMs is the session TTL the tests use: etcd's minimum with its default
// election timeout, so expiry tests wait as little as etcd allows.
const ttlMs = 2000

// newEnv is a lease service of its own on the shared etcd, under a prefix of
// the test's own.
func newEnv(t *testing.T, opts ...lease.Option) *leasetest.Env {
	t.Helper()
	return leasetest.StartOn(t, sharedEtcd, append([]lease.Option{lease.WithPrefix(testPrefix(t))}, opts...)...)
}

// testPrefix is t's own key prefix: its name and, since -count=2 runs it
// again on the same etcd, which run of the package's tests this is. It is
// the same for every call within one test.
func testPrefix(t *testing.T) string {
	if p, ok := prefixes.Load(t); ok {
		return p.(string)
	}
	p := fmt.Sprintf("/test/%s/%d/", strings.ReplaceAll(t.Name(), "/", "_"), prefixRuns.Add(1))
	prefixes.Store(t, p)
	t.Cleanup(func() { prefixes.Delete(t) })
	return p
}

var (
	prefixes   sync.Map // *testing.T -> string
	prefixRuns atomic.Int64
)

// testCtx bounds a test's calls.
func testCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func replicas(ids ...string) []*tenurev1.Replica {
	out := make([]*tenurev1.Replica, 0, len(ids))
	for i, id := range ids {
		out = append(out, &tenurev1.Replica{Id: id, Address: fmt.Sprintf("http://127.0.0.1:%d", 7101+i)})
	}
	return out
}

func createRange(t *testing.T, ctx context.Context, c tenurev1connect.LeaseServiceClient, id string) *tenurev1.RangeInfo {
	t.Helper()
	resp, err := c.CreateRange(ctx, connect.NewRequest(&tenurev1.CreateRangeRequest{RangeId: id, Replicas: replicas("r1", "r2", "r3")}))
	if err != nil {
		t.Fatalf("CreateRange(%q) = %v", id, err)
	}
	return resp.Msg.GetRange()
}

func openSession(t *testing.T, ctx context.Context, c tenurev1connect.LeaseServiceClient, holder string, ttl int64) int64 {
	t.Helper()
	resp, err := c.OpenSession(ctx, connect.NewRequest(&tenurev1.OpenSessionRequest{HolderId: holder, HolderAddress: "http://" + holder, TtlMs: ttl}))
	if err != nil {
		t.Fatalf("OpenSession(%q) = %v", holder, err)
	}
	return resp.Msg.GetSessionId()
}

func grant(t *testing.T, ctx context.Context, c tenurev1connect.LeaseServiceClient, rangeID string, prev uint64, holder string, session int64) uint64 {
	t.Helper()
	resp, err := c.GrantEpoch(ctx, connect.NewRequest(&tenurev1.GrantEpochRequest{RangeId: rangeID, PreviousEpoch: prev, HolderId: holder, SessionId: session}))
	if err != nil {
		t.Fatalf("GrantEpoch(%q, previous %d) = %v", rangeID, prev, err)
	}
	if got, want := resp.Msg.GetEpoch(), prev+1; got != want {
		t.Fatalf("GrantEpoch(%q, previous %d) = epoch %d, want %d", rangeID, prev, got, want)
	}
	return resp.Msg.GetEpoch()
}

func wantCode(t *testing.T, what string, err error, want connect.Code) {
	t.Helper()
	if got := connect.CodeOf(err); err == nil || got != want {
		t.Fatalf("%s = %v (code %v), want code %v", what, err, got, want)
	}
}

// currentRevision is etcd's revision now, for starting a watch at a definite
// point.
func currentRevision(t *testing.T, env *leasetest.Env) int64 {
	t.Helper()
	r, err := env.EtcdClient.Get(testCtx(t, 10*time.Second), "/no-such-key")
	if err != nil {
		t.Fatalf("etcd Get() = %v", err)
	}
	return r.Header.Revision
}

// watchStream is a WatchLeases stream read into a channel.
type watchStream struct {
	events chan *tenurev1.WatchLeasesResponse
	err    chan error
	cancel context.CancelFunc
}

func startWatch(t *testing.T, c tenurev1connect.LeaseServiceClient, after int64, rangeIDs ...string) *watchStream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	stream, err := c.WatchLeases(ctx, connect.NewRequest(&tenurev1.WatchLeasesRequest{RangeIds: rangeIDs, AfterRevision: after}))
	if err != nil {
		t.Fatalf("WatchLeases() = %v", err)
	}
	w := &watchStream{events: make(chan *tenurev1.WatchLeasesResponse, 1024), err: make(chan error, 1), cancel: cancel}
	go func() {
		defer close(w.events)
		for stream.Receive() {
			w.events <- stream.Msg()
		}
		w.err <- stream.Err()
	}()
	return w
}

// next is the next event, failing the test if none comes within d.
func (w *watchStream) next(t *testing.T, d time.Duration) *tenurev1.WatchLeasesResponse {
	t.Helper()
	select {
	case ev, ok := <-w.events:
		if !ok {
			t.Fatalf("watch ended: %v", <-w.err)
		}
		return ev
	case <-time.After(d):
		t.Fatalf("no watch event within %v", d)
		return nil
	}
}

// none fails the test if an event arrives within d.
func (w *watchStream) none(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case ev, ok := <-w.events:
		if ok {
			t.Fatalf("unexpected watch event %v", ev)
		}
	case <-time.After(d):
	}
}

// expect reads events until one of type typ for rangeID arrives, failing on
// any other event for rangeID first (events of other ranges are skipped).
func (w *watchStream) expect(t *testing.T, d time.Duration, typ tenurev1.LeaseEventType, rangeID string) *tenurev1.WatchLeasesResponse {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ev := w.next(t, time.Until(deadline))
		if ev.GetRangeId() != rangeID {
			continue
		}
		if ev.GetType() != typ {
			t.Fatalf("watch event for %q = %v, want %v", rangeID, ev, typ)
		}
		return ev
	}
}

// eventually polls cond every 20 ms for at most d.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < d {
		if cond() {
			return time.Since(start)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: not within %v", what, d)
	return 0
}
