package replica_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/tenurelog/tenure/internal/testlog"
	"github.com/tenurelog/tenure/internal/testnet"
	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
	"github.com/tenurelog/tenure/services/replica"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

// This file is the test driver: real replicas (real Badger in t.TempDir(),
// real HTTP/2 Connect servers on loopback) and a driver that fences,
// truncates and adopts them the way the promoter will.

// rangeID is the range every test replicates.
const rangeID = "orders-0"

// node is one replica process of a test cluster, restartable on its data
// directory and address.
type node struct {
	id     string
	dir    string
	listen string // testnet.FreeAddr at first; the bound address after, so a restart keeps the URL
	gate   *gate
	// opts are the store options of the next start (crash injection).
	opts  logstore.Options
	lease replica.LeaseGuard
	// metrics, when set, receives the next start's series (a fresh
	// registry per start: a restart registers them again).
	metrics prometheus.Registerer

	r   *replica.Replica
	srv *transport.Server
	url string
	// hc is the driver's client to this node, new at every start so no
	// request rides a connection to the previous process.
	hc *http.Client
	rc tenurev1connect.ReplicaServiceClient
	lc tenurev1connect.LogServiceClient
}

// cluster is a set of nodes and the driver's clients to them.
type cluster struct {
	t     testing.TB
	nodes []*node
	logs  *testlog.Buffer
	// fetchWait is the followers' long poll.
	fetchWait time.Duration
	// retentionInterval is the next starts' Config.RetentionInterval (0:
	// the default).
	retentionInterval time.Duration
	// base holds every node's data directories.
	base string
	dirs int
}

// freshDir returns a new, empty data directory for a node.
func (c *cluster) freshDir(id string) string {
	c.t.Helper()
	c.dirs++
	dir := filepath.Join(c.base, fmt.Sprintf("%s-%d", id, c.dirs))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		c.t.Fatal(err)
	}
	return dir
}

// newCluster starts n replicas r1..rn.
func newCluster(t testing.TB, n int) *cluster {
	t.Helper()
	c := &cluster{t: t, logs: &testlog.Buffer{}, fetchWait: 300 * time.Millisecond}
	// The data directories' removal is registered first so it runs last:
	// cleanups run in reverse, and Badger must close before its files go.
	c.base = t.TempDir()
	t.Cleanup(func() {
		for _, nd := range c.nodes {
			c.stop(nd)
		}
		if t.Failed() {
			t.Logf("replica logs:\n%s", c.logs.String())
		}
	})
	for i := 1; i <= n; i++ {
		nd := &node{id: fmt.Sprintf("r%d", i), listen: testnet.FreeAddr(t), gate: &gate{}}
		nd.dir = c.freshDir(nd.id)
		c.nodes = append(c.nodes, nd)
		c.start(nd)
	}
	return c
}

func (c *cluster) node(i int) *node { return c.nodes[i-1] }

// start starts (or restarts) a node on its data directory and address.
func (c *cluster) start(n *node) {
	c.t.Helper()
	if err := c.tryStart(n); err != nil {
		c.t.Fatalf("start %s: %v", n.id, err)
	}
}

func (c *cluster) tryStart(n *node) error {
	hc := transport.NewHTTPClient()
	n.gate.rt = hc.Transport
	hc.Transport = n.gate
	cfg := replica.Config{
		ID:            n.id,
		DataDir:       n.dir,
		Logger:        slog.New(slog.NewTextHandler(c.logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
		HTTPClient:    hc,
		StoreOptions:  n.opts,
		Lease:         n.lease,
		FetchWait:     c.fetchWait,
		AppendTimeout: 30 * time.Second,
		// Set before a restart; newCluster's first starts take the default.
		RetentionInterval: c.retentionInterval,
		Metrics:           n.metrics,
	}
	var err error
	// A restart rebinds the same port; the old listener is closed, but give
	// the kernel a few tries. Only a lingering close is waited out here:
	// the port is below the ephemeral range, so no other test takes it.
	for try := 0; try < 50; try++ {
		n.r, n.srv, err = replica.Start(cfg, n.listen)
		if err == nil || !strings.Contains(err.Error(), "address already in use") {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	n.listen = n.srv.Addr
	n.url = n.srv.URL()
	n.hc = transport.NewHTTPClient()
	n.rc = tenurev1connect.NewReplicaServiceClient(n.hc, n.url, transport.ClientOptions()...)
	n.lc = tenurev1connect.NewLogServiceClient(n.hc, n.url, transport.ClientOptions()...)
	return nil
}

// stop stops a node the way a crash looks to its peers: connections drop.
func (c *cluster) stop(n *node) {
	if n.srv != nil {
		_ = n.srv.Close()
		n.srv = nil
		n.hc.CloseIdleConnections()
	}
	if n.r != nil {
		if err := n.r.Close(); err != nil {
			c.t.Logf("close %s: %v", n.id, err)
		}
		n.r = nil
	}
}

func (c *cluster) restart(n *node) {
	c.t.Helper()
	c.stop(n)
	c.start(n)
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// replicas is the replica set of the given nodes.
func replicas(ns ...*node) []*tenurev1.Replica {
	out := make([]*tenurev1.Replica, len(ns))
	for i, n := range ns {
		out[i] = &tenurev1.Replica{Id: n.id, Address: n.url}
	}
	return out
}

func (c *cluster) fence(n *node, epoch uint64) (*tenurev1.FenceResponse, error) {
	resp, err := n.rc.Fence(ctxT(c.t), connect.NewRequest(&tenurev1.FenceRequest{RangeId: rangeID, Epoch: epoch, FencerId: "driver"}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

func (c *cluster) mustFence(n *node, epoch uint64) *tenurev1.FenceResponse {
	c.t.Helper()
	a, err := c.fence(n, epoch)
	if err != nil {
		c.t.Fatalf("Fence(%s, %d) = %v", n.id, epoch, err)
	}
	return a
}

func (c *cluster) adopt(n *node, epoch uint64, role tenurev1.Role, leader *node, bound uint64) (*tenurev1.AdoptResponse, error) {
	resp, err := n.rc.Adopt(ctxT(c.t), connect.NewRequest(&tenurev1.AdoptRequest{
		RangeId: rangeID, Epoch: epoch, Role: role,
		LeaderId: leader.id, LeaderAddress: leader.url,
		Replicas: replicas(c.nodes...), CommittedBound: bound,
	}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

func (c *cluster) mustAdopt(n *node, epoch uint64, role tenurev1.Role, leader *node, bound uint64) *tenurev1.AdoptResponse {
	c.t.Helper()
	a, err := c.adopt(n, epoch, role, leader, bound)
	if err != nil {
		c.t.Fatalf("Adopt(%s, %d, %s, leader %s) = %v", n.id, epoch, role, leader.id, err)
	}
	return a
}

// elect plays a promotion at epoch: fence every given node, adopt leader
// with the committed bound of their answers, and the others as followers.
func (c *cluster) elect(epoch uint64, leader *node, followers ...*node) {
	c.t.Helper()
	var bound uint64
	for _, n := range append([]*node{leader}, followers...) {
		bound = max(bound, c.mustFence(n, epoch).GetHighWaterMark())
	}
	c.mustAdopt(leader, epoch, tenurev1.Role_ROLE_LEADER, leader, bound)
	for _, f := range followers {
		c.mustAdopt(f, epoch, tenurev1.Role_ROLE_FOLLOWER, leader, 0)
	}
}

func (c *cluster) append(ctx context.Context, n *node, vals ...[]byte) (*tenurev1.AppendResponse, error) {
	resp, err := n.lc.Append(ctx, connect.NewRequest(&tenurev1.AppendRequest{RangeId: rangeID, Records: vals}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

func (c *cluster) mustAppend(n *node, vals ...[]byte) *tenurev1.AppendResponse {
	c.t.Helper()
	a, err := c.append(ctxT(c.t), n, vals...)
	if err != nil {
		c.t.Fatalf("Append(%s, %d records) = %v", n.id, len(vals), err)
	}
	return a
}

func (c *cluster) status(n *node) *tenurev1.RangeStatus {
	c.t.Helper()
	resp, err := n.rc.GetStatus(ctxT(c.t), connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: rangeID}))
	if err != nil {
		c.t.Fatalf("GetStatus(%s) = %v", n.id, err)
	}
	return resp.Msg.GetRanges()[0]
}

func (c *cluster) history(n *node) *tenurev1.GetEpochHistoryResponse {
	c.t.Helper()
	resp, err := n.rc.GetEpochHistory(ctxT(c.t), connect.NewRequest(&tenurev1.GetEpochHistoryRequest{RangeId: rangeID}))
	if err != nil {
		c.t.Fatalf("GetEpochHistory(%s) = %v", n.id, err)
	}
	return resp.Msg
}

// readAll reads every committed record from the leader n.
func (c *cluster) readAll(n *node) []*tenurev1.Record {
	c.t.Helper()
	var out []*tenurev1.Record
	for {
		resp, err := n.lc.Read(ctxT(c.t), connect.NewRequest(&tenurev1.ReadRequest{RangeId: rangeID, Offset: uint64(len(out))}))
		if err != nil {
			c.t.Fatalf("Read(%s, %d) = %v", n.id, len(out), err)
		}
		out = append(out, resp.Msg.GetRecords()...)
		if len(resp.Msg.GetRecords()) == 0 || uint64(len(out)) >= resp.Msg.GetHighWaterMark() {
			return out
		}
	}
}

// storeLog is every record in n's log, committed or not.
func (c *cluster) storeLog(n *node) []*tenurev1.Record {
	c.t.Helper()
	recs, err := n.r.LogForTest(rangeID)
	if err != nil {
		c.t.Fatalf("log of %s: %v", n.id, err)
	}
	return recs
}

// waitUntil polls cond every 10ms for up to d.
func waitUntil(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitCaughtUp waits until every follower holds the leader's log and HWM.
func (c *cluster) waitCaughtUp(leader *node, followers ...*node) {
	c.t.Helper()
	for _, f := range followers {
		waitUntil(c.t, 10*time.Second, f.id+" catching up with "+leader.id, func() bool {
			l, s := c.status(leader), c.status(f)
			return s.GetLogEnd() == l.GetLogEnd() && s.GetHighWaterMark() == l.GetHighWaterMark() && l.GetHighWaterMark() == l.GetLogEnd()
		})
	}
}

// sameLogs fails unless every node holds exactly want, byte for byte.
func (c *cluster) sameLogs(want []*tenurev1.Record, ns ...*node) {
	c.t.Helper()
	for _, n := range ns {
		got := c.storeLog(n)
		if len(got) != len(want) {
			c.t.Fatalf("%s holds %d records, want %d", n.id, len(got), len(want))
		}
		for i := range want {
			if !proto.Equal(got[i], want[i]) {
				c.t.Fatalf("%s record %d = %v, want %v", n.id, i, got[i], want[i])
			}
		}
	}
}

func values(prefix string, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = []byte(fmt.Sprintf("%s-%d", prefix, i))
	}
	return out
}

func wantCode(t testing.TB, what string, err error, code connect.Code) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s = nil error, want %v", what, code)
	}
	if got := connect.CodeOf(err); got != code {
		t.Fatalf("%s = %v (%v), want %v", what, got, err, code)
	}
}

// gate is the test transport seam of a node's fetch client: it drops
// fetches its filter refuses, before sending and again when the answer
// arrives, so a partition that starts during a long poll also loses the
// answer.
type gate struct {
	rt    http.RoundTripper
	mu    sync.Mutex
	allow func(*tenurev1.FetchRequest) bool // nil lets everything through
	// noStream answers FetchStream and FetchSession as a replica without
	// them does (404, which Connect reads as Unimplemented); noSession only
	// FetchSession, as a replica with per-range streams only.
	noStream, noSession bool
	// calls counts the fetch calls made through the gate, by procedure
	// name ("Fetch", "FetchStream", "FetchSession"): a stream counts once.
	calls map[string]int
	// holding, while set, keeps the messages a fetch session receives
	// (FetchStreams are not held): each session buffers them, and once
	// holding is cleared delivers them as one message, as a leader
	// combines the answers that became ready while it was sending.
	// heldRecordAnswers counts the answers with records buffered so far.
	holding           atomic.Bool
	heldRecordAnswers atomic.Int64
	// pullMessages is the number of pulls in each session message sent
	// with any, recordMessages the number of answers with records in each
	// session message received with any (not held), in order.
	pullMessages, recordMessages []int
}

// sizes returns a copy of one of the gate's message logs.
func (g *gate) sizes(log *[]int) []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]int(nil), (*log)...)
}

func (g *gate) logSize(log *[]int, n int) {
	if n == 0 {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	*log = append(*log, n)
}

// count is how many calls of procedure went through the gate.
func (g *gate) count(procedure string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.calls[procedure]
}

var errPartitioned = errors.New("test gate: partitioned")

func (g *gate) set(allow func(*tenurev1.FetchRequest) bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.allow = allow
}

func (g *gate) block() { g.set(func(*tenurev1.FetchRequest) bool { return false }) }
func (g *gate) open()  { g.set(nil) }
func (g *gate) filter() func(*tenurev1.FetchRequest) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.allow
}

func (g *gate) RoundTrip(req *http.Request) (*http.Response, error) {
	if i := strings.LastIndexByte(req.URL.Path, '/'); i >= 0 && strings.HasPrefix(req.URL.Path[i+1:], "Fetch") {
		g.mu.Lock()
		if g.calls == nil {
			g.calls = map[string]int{}
		}
		g.calls[req.URL.Path[i+1:]]++
		g.mu.Unlock()
	}
	if session := strings.HasSuffix(req.URL.Path, "/FetchSession"); session || strings.HasSuffix(req.URL.Path, "/FetchStream") {
		g.mu.Lock()
		old := g.noStream || (session && g.noSession)
		g.mu.Unlock()
		if old {
			_ = req.Body.Close()
			return &http.Response{StatusCode: http.StatusNotFound, Status: "404 Not Found", Proto: "HTTP/2.0", ProtoMajor: 2,
				Header: http.Header{}, Body: http.NoBody, Request: req}, nil
		}
		return g.roundTripStream(req, session)
	}
	if !strings.HasSuffix(req.URL.Path, "/Fetch") {
		return g.rt.RoundTrip(req)
	}
	body, err := io.ReadAll(req.Body)
	_ = req.Body.Close()
	if err != nil {
		return nil, err
	}
	msg := body
	if strings.HasPrefix(req.Header.Get("Content-Type"), "application/grpc") {
		// gRPC framing: a flags byte (0: uncompressed), a 4-byte length, the message.
		if len(body) < 5 || body[0] != 0 {
			return nil, fmt.Errorf("test gate: unexpected fetch framing")
		}
		msg = body[5:]
	} else if ct := req.Header.Get("Content-Type"); ct != "application/proto" || req.Header.Get("Content-Encoding") != "" {
		// Connect unary: the message itself, uncompressed.
		return nil, fmt.Errorf("test gate: unexpected fetch content type %q", ct)
	}
	var m tenurev1.FetchRequest
	if err := proto.Unmarshal(msg, &m); err != nil {
		return nil, err
	}
	allowed := func() bool { f := g.filter(); return f == nil || f(&m) }
	if !allowed() {
		return nil, errPartitioned
	}
	out := req.Clone(req.Context())
	out.Body = io.NopCloser(bytes.NewReader(body))
	out.ContentLength = int64(len(body))
	resp, err := g.rt.RoundTrip(out)
	if err == nil && !allowed() {
		_ = resp.Body.Close()
		return nil, errPartitioned
	}
	return resp, err
}

// roundTripStream gates a FetchStream or a FetchSession per message: a
// fetch the filter refuses breaks the stream before it is sent, and so does
// an answer that arrives while the filter refuses a fetch sent on it. The
// follower then opens a new stream, as it would after a real network
// failure. (On a session that is every range's stream to the leader, as a
// real partition between the two replicas would be.)
func (g *gate) roundTripStream(req *http.Request, session bool) (*http.Response, error) {
	if ct := req.Header.Get("Content-Type"); ct != "application/connect+proto" {
		return nil, fmt.Errorf("test gate: unexpected fetch stream content type %q", ct)
	}
	body := &gatedRequests{g: g, r: req.Body, session: session, sent: map[string]*tenurev1.FetchRequest{}}
	out := req.Clone(req.Context())
	out.Body = body
	resp, err := g.rt.RoundTrip(out)
	if err != nil {
		return nil, err
	}
	if session {
		resp.Body = &gatedSessionAnswers{gatedAnswers{body: body, ReadCloser: resp.Body}, nil, nil}
		return resp, nil
	}
	resp.Body = &gatedAnswers{body: body, ReadCloser: resp.Body}
	return resp, nil
}

// gatedRequests passes a stream's request envelopes (a flags byte, a 4-byte
// big-endian length, the message) one whole envelope at a time, checking
// each fetch against the gate.
type gatedRequests struct {
	g       *gate
	r       io.ReadCloser
	session bool   // FetchSessionRequests, not FetchStreamRequests
	pending []byte // the rest of the envelope being passed on

	mu   sync.Mutex
	sent map[string]*tenurev1.FetchRequest // the last fetch sent, by range
}

func (b *gatedRequests) Read(p []byte) (int, error) {
	if len(b.pending) == 0 {
		env, err := readEnvelope(b.r)
		if err != nil {
			return 0, err
		}
		if env[0] != 0 {
			return 0, fmt.Errorf("test gate: unexpected fetch stream envelope flags %#x", env[0])
		}
		var fetches []*tenurev1.FetchRequest
		if b.session {
			var m tenurev1.FetchSessionRequest
			if err := proto.Unmarshal(env[5:], &m); err != nil {
				return 0, err
			}
			for _, p := range m.GetPulls() {
				fetches = append(fetches, p.GetFetch())
			}
			b.g.logSize(&b.g.pullMessages, len(m.GetPulls()))
		} else {
			var m tenurev1.FetchStreamRequest
			if err := proto.Unmarshal(env[5:], &m); err != nil {
				return 0, err
			}
			fetches = append(fetches, m.GetFetch())
		}
		for _, f := range fetches {
			if !b.g.allows(f) {
				return 0, errPartitioned
			}
		}
		b.mu.Lock()
		for _, f := range fetches {
			b.sent[f.GetRangeId()] = f
		}
		b.mu.Unlock()
		b.pending = env
	}
	n := copy(p, b.pending)
	b.pending = b.pending[n:]
	return n, nil
}

func (b *gatedRequests) Close() error { return b.r.Close() }

// refused reports whether the gate now refuses a fetch sent on the stream
// (the last one of each range).
func (b *gatedRequests) refused() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range b.sent {
		if !b.g.allows(m) {
			return true
		}
	}
	return false
}

// gatedAnswers drops the answer stream while the gate refuses a fetch
// sent on it.
type gatedAnswers struct {
	io.ReadCloser
	body *gatedRequests
}

func (a *gatedAnswers) Read(p []byte) (int, error) {
	n, err := a.ReadCloser.Read(p)
	if a.body.refused() {
		return 0, errPartitioned
	}
	return n, err
}

// gatedSessionAnswers is gatedAnswers for a fetch session, read one whole
// envelope at a time so that, while the gate holds, messages are buffered
// and then merged into one (gate.holding).
type gatedSessionAnswers struct {
	gatedAnswers
	held    []*tenurev1.SessionAnswer // answers of the messages held
	pending []byte                    // the rest of the envelope being passed on
}

func (a *gatedSessionAnswers) Read(p []byte) (int, error) {
	g := a.body.g
	for len(a.pending) == 0 {
		env, err := readEnvelope(a.ReadCloser)
		if err != nil {
			return 0, err
		}
		if a.body.refused() {
			return 0, errPartitioned
		}
		if env[0] == 0 && !g.holding.Load() {
			var m tenurev1.FetchSessionResponse
			if err := proto.Unmarshal(env[5:], &m); err != nil {
				return 0, err
			}
			g.logSize(&g.recordMessages, recordAnswers(&m))
		}
		if env[0] != 0 || !g.holding.Load() {
			// The end of the stream, or not held: after what was held.
			if len(a.held) > 0 {
				m, err := proto.Marshal(&tenurev1.FetchSessionResponse{Answers: a.held})
				if err != nil {
					return 0, err
				}
				a.held = nil
				a.pending = binary.BigEndian.AppendUint32([]byte{0}, uint32(len(m)))
				a.pending = append(a.pending, m...)
			}
			a.pending = append(a.pending, env...)
			break
		}
		var m tenurev1.FetchSessionResponse
		if err := proto.Unmarshal(env[5:], &m); err != nil {
			return 0, err
		}
		g.heldRecordAnswers.Add(int64(recordAnswers(&m)))
		a.held = append(a.held, m.GetAnswers()...)
	}
	n := copy(p, a.pending)
	a.pending = a.pending[n:]
	return n, nil
}

// recordAnswers is how many of m's answers carry records.
func recordAnswers(m *tenurev1.FetchSessionResponse) int {
	n := 0
	for _, ans := range m.GetAnswers() {
		if len(ans.GetFetch().GetRecords()) > 0 {
			n++
		}
	}
	return n
}

// readEnvelope reads one whole Connect stream envelope from r: a flags
// byte, a 4-byte big-endian length, the message.
func readEnvelope(r io.Reader) ([]byte, error) {
	var head [5]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, err
	}
	env := make([]byte, 5+binary.BigEndian.Uint32(head[1:]))
	copy(env, head[:])
	if _, err := io.ReadFull(r, env[5:]); err != nil {
		return nil, err
	}
	return env, nil
}

func (g *gate) allows(m *tenurev1.FetchRequest) bool {
	f := g.filter()
	return f == nil || f(m)
}
