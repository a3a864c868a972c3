package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/internal/fanout"
	"github.com/tenurelog/tenure/internal/tlshint"
	"github.com/tenurelog/tenure/pkg/auth"
	"github.com/tenurelog/tenure/pkg/leaseclient"
	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// The defaults are the services' own default listen addresses, which is
// also where 'tenure dev' puts them.
const (
	defaultLeaseURL    = "http://127.0.0.1:7000"
	defaultPromoterURL = "http://127.0.0.1:7200"
)

// rpcTimeout bounds each unary call a command makes; a server slower than
// this is reported as unreachable, not waited for.
const rpcTimeout = 5 * time.Second

// globalFlags are the flags every cluster command takes, before the command
// name ("tenurectl --json status") or among its own arguments.
type globalFlags struct {
	lease, promoter   string
	json              bool
	cacert, cert, key string // TLS files given before the command
}

// parseGlobal takes the global flags off the front of args.
func parseGlobal(e *env, args []string) ([]string, error) {
	for len(args) > 0 {
		name, value, hasValue := strings.Cut(strings.TrimLeft(args[0], "-"), "=")
		if !strings.HasPrefix(args[0], "-") {
			return args, nil
		}
		switch name {
		case "json":
			e.global.json = !hasValue || value == "true"
			args = args[1:]
			continue
		case "lease", "promoter", "cacert", "cert", "key":
		default:
			return args, nil
		}
		if !hasValue {
			if len(args) < 2 {
				if name == "lease" || name == "promoter" {
					return nil, fmt.Errorf("flag --%s needs a URL", name)
				}
				return nil, fmt.Errorf("flag --%s needs a FILE", name)
			}
			value, args = args[1], args[1:]
		}
		switch name {
		case "cacert":
			e.global.cacert, args = value, args[1:]
			continue
		case "cert":
			e.global.cert, args = value, args[1:]
			continue
		case "key":
			e.global.key, args = value, args[1:]
			continue
		}
		if err := (urlValue{s: new(string), list: true}).Set(value); err != nil {
			return nil, fmt.Errorf("invalid value %q for flag --%s: %v", value, name, err)
		}
		args = args[1:]
		if name == "lease" {
			e.global.lease = value
		} else {
			e.global.promoter = value
		}
	}
	return args, nil
}

// clusterOpts are a cluster command's resolved global flags.
type clusterOpts struct {
	lease, promoter *string
	json            *bool
	// cacert, cert and key are the TLS files (etcdctl's names): with all
	// three, every call is mutual TLS as the certificate's roles allow.
	cacert, cert, key *string
}

// addClusterFlags defines --lease, --promoter and --json on a command's
// flag set. A value given before the command name wins over the environment
// (TENURECTL_LEASE, TENURECTL_PROMOTER), which wins over the default.
func addClusterFlags(e *env, fs *flag.FlagSet) clusterOpts {
	pick := func(global, envName, def string) string {
		if global != "" {
			return global
		}
		if v := e.getenv(envName); v != "" {
			return v
		}
		return def
	}
	lease, promoter := pick(e.global.lease, "TENURECTL_LEASE", defaultLeaseURL), pick(e.global.promoter, "TENURECTL_PROMOTER", defaultPromoterURL)
	fs.Var(urlValue{s: &lease, list: true}, "lease", "lease service base `URL`, or HOST:PORT, or several instances of it separated by commas, tried in turn when one does not answer (env TENURECTL_LEASE)")
	fs.Var(urlValue{s: &promoter, list: true}, "promoter", "promoter base `URL`, or HOST:PORT, or several promoters separated by commas, tried in turn when one does not answer (env TENURECTL_PROMOTER)")
	return clusterOpts{
		lease:    &lease,
		promoter: &promoter,
		json:     fs.Bool("json", e.global.json, "print JSON instead of a table"),
		cacert:   fs.String("cacert", pick(e.global.cacert, "TENURECTL_CACERT", ""), "the CA certificate (PEM `FILE`) the servers' certificates must chain to (env TENURECTL_CACERT); with --cert and --key, calls are mutual TLS and http:// URLs mean https://"),
		cert:     fs.String("cert", pick(e.global.cert, "TENURECTL_CERT", ""), "the client certificate (PEM `FILE`), e.g. operator.pem from tenure certs init (env TENURECTL_CERT)"),
		key:      fs.String("key", pick(e.global.key, "TENURECTL_KEY", ""), "the client certificate's key (PEM `FILE`) (env TENURECTL_KEY)"),
	}
}

// setupTLS installs the command's TLS identity, if its files are given.
func (o clusterOpts) setupTLS() error {
	files := auth.Files{CA: *o.cacert, Cert: *o.cert, Key: *o.key}
	if !files.Configured() {
		return nil
	}
	if files.CA == "" || files.Cert == "" || files.Key == "" {
		// In tenurectl's flag names: auth.Load's error names the servers'
		// (--tls-cert, --tls-key, --tls-ca).
		return tlsSetupError{errors.New("mutual TLS needs all three of --cacert, --cert and --key (or TENURECTL_CACERT, TENURECTL_CERT, TENURECTL_KEY); give all three, or none for cleartext")}
	}
	src, err := auth.Load(files, slog.New(slog.DiscardHandler))
	if err != nil {
		return tlsSetupError{fmt.Errorf("loading --cacert, --cert and --key: %w", err)}
	}
	transport.SetTLS(src)
	return nil
}

// tlsSetupError is a TLS setup of this client that did not load: every
// call fails with it before anything is sent, and explain reports it as
// it is, not as the server's answer.
type tlsSetupError struct{ err error }

func (e tlsSetupError) Error() string { return e.err.Error() }
func (e tlsSetupError) Unwrap() error { return e.err }

// tls says whether the command's calls are mutual TLS (all three files
// given), which is what a HOST:PORT or http:// URL then means.
func (o clusterOpts) tls() bool {
	return auth.Files{CA: *o.cacert, Cert: *o.cert, Key: *o.key}.Configured()
}

// urlValue is a flag naming a server, checked as it is set by
// transport.BaseURL's rule (the same in every command and in tenure's own
// flags); newClients resolves it once TLS is known. With list, it may name
// several instances of the server separated by commas (transport.BaseURLs:
// --lease).
type urlValue struct {
	s    *string
	list bool
}

func (u urlValue) String() string {
	if u.s == nil {
		return ""
	}
	return *u.s
}

func (u urlValue) Set(v string) error {
	check := func(v string) error { _, err := transport.BaseURL(v, false); return err }
	if u.list {
		check = func(v string) error { _, err := transport.BaseURLs(v, false); return err }
	}
	if err := check(v); err != nil {
		return err
	}
	*u.s = v
	return nil
}

// clients are the Connect clients of one command run, built the way every
// tenure client is (pkg/transport: HTTP/2 cleartext, read limits).
type clients struct {
	http *http.Client
	// leaseURL is --lease as resolved: one URL, or several separated by
	// commas, which lease fails over between (pkg/leaseclient).
	leaseURL    string
	promoterURL string
	lease       tenurev1connect.LeaseServiceClient
	promoter    tenurev1connect.PromoterServiceClient
}

func newClients(o clusterOpts) *clients {
	var hc *http.Client
	if err := o.setupTLS(); err != nil {
		// Every call of the command then fails with why, the way a bad
		// URL does, rather than speaking cleartext to a TLS cluster.
		hc = &http.Client{Transport: failingTransport{err}}
	} else {
		hc = transport.NewHTTPClient()
	}
	// HOST:PORT and, under TLS, http:// mean the scheme the calls speak.
	// (Flags were checked as they were parsed, the environment by run.)
	pc, err := promoterClient(hc, o)
	if err != nil {
		// Checked as parsed: not reached but for a list the parse let by.
		pc = tenurev1connect.NewPromoterServiceClient(&http.Client{Transport: failingTransport{err}}, "http://invalid", transport.ClientOptions()...)
	}
	var lc tenurev1connect.LeaseServiceClient
	leaseURLs, err := transport.BaseURLs(*o.lease, o.tls())
	if err == nil {
		*o.lease = strings.Join(leaseURLs, ",")
		var c *leaseclient.Client
		if c, err = leaseclient.New(hc, leaseURLs); err == nil {
			lc = c
		}
	}
	if err != nil {
		// Checked as parsed: not reached but for a list the parse let by.
		lc = tenurev1connect.NewLeaseServiceClient(&http.Client{Transport: failingTransport{err}}, "http://invalid", transport.ClientOptions()...)
	}
	return &clients{
		http:        hc,
		leaseURL:    *o.lease,
		promoterURL: *o.promoter,
		lease:       lc,
		promoter:    pc,
	}
}

// promoterSafe are the promoter procedures a call may repeat at another
// promoter after an unknown outcome: reads. A promotion, a membership
// change or a deletion goes to the next promoter only when the first one
// never saw it (its dial failed), which transport.Failover does for every
// call.
var promoterSafe = map[string]bool{
	tenurev1connect.PromoterServiceGetStatusProcedure:       true,
	tenurev1connect.PromoterServiceListTransitionsProcedure: true,
}

// promoterClient is the client of --promoter: one promoter, or several
// (a deployment's elected one and its standbys: any of them answers, a
// standby by forwarding to the elected one), tried in turn when one does
// not answer. *o.promoter is set to the resolved URLs, for messages.
func promoterClient(hc *http.Client, o clusterOpts) (tenurev1connect.PromoterServiceClient, error) {
	urls, err := transport.BaseURLs(*o.promoter, o.tls())
	if err != nil {
		return nil, err
	}
	*o.promoter = strings.Join(urls, ",")
	if len(urls) == 1 {
		return tenurev1connect.NewPromoterServiceClient(hc, urls[0], transport.ClientOptions()...), nil
	}
	f, err := transport.NewFailover(hc, urls, func(procedure string) bool { return promoterSafe[procedure] })
	if err != nil {
		return nil, err
	}
	return tenurev1connect.NewPromoterServiceClient(f, f.BaseURL(), transport.ClientOptions()...), nil
}

func (c *clients) close() { c.http.CloseIdleConnections() }

// failingTransport fails every request with err (a TLS setup that did not
// load).
type failingTransport struct{ err error }

func (t failingTransport) RoundTrip(*http.Request) (*http.Response, error) { return nil, t.err }

func (c *clients) replica(addr string) tenurev1connect.ReplicaServiceClient {
	return tenurev1connect.NewReplicaServiceClient(c.http, addr, transport.ClientOptions()...)
}

func (c *clients) log(addr string) tenurev1connect.LogServiceClient {
	return tenurev1connect.NewLogServiceClient(c.http, addr, transport.ClientOptions()...)
}

// getRange reads a range from the lease service.
func (c *clients) getRange(ctx context.Context, rangeID string) (*tenurev1.RangeInfo, error) {
	cctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	resp, err := c.lease.GetRange(cctx, connect.NewRequest(&tenurev1.GetRangeRequest{RangeId: rangeID}))
	if err != nil {
		if connect.CodeOf(err) == connect.CodeNotFound {
			return nil, fmt.Errorf("range %q does not exist; 'tenurectl range list' lists ranges, 'tenurectl range create' makes one", rangeID)
		}
		return nil, c.leaseErr(err)
	}
	return resp.Msg.GetRange(), nil
}

// missingRange returns getRange's "does not exist" error when rangeID is
// not a range, else nil: a command whose server answered NotFound (or
// nothing at all) learns whether the range is what was not found, and says
// so in tenurectl's words rather than the server's RPC names.
func (c *clients) missingRange(ctx context.Context, rangeID string) error {
	if _, err := c.getRange(ctx, rangeID); err != nil && strings.Contains(err.Error(), "does not exist") {
		return err
	}
	return nil
}

// listRanges reads every range, a page at a time (bounded).
func (c *clients) listRanges(ctx context.Context) ([]*tenurev1.RangeInfo, error) {
	var out []*tenurev1.RangeInfo
	after := ""
	for range 10_000 {
		cctx, cancel := context.WithTimeout(ctx, rpcTimeout)
		resp, err := c.lease.ListRanges(cctx, connect.NewRequest(&tenurev1.ListRangesRequest{AfterRangeId: after, Limit: 1000}))
		cancel()
		if err != nil {
			return nil, c.leaseErr(err)
		}
		out = append(out, resp.Msg.GetRanges()...)
		if !resp.Msg.GetMore() || len(resp.Msg.GetRanges()) == 0 {
			return out, nil
		}
		after = resp.Msg.GetRanges()[len(resp.Msg.GetRanges())-1].GetRangeId()
	}
	return nil, errors.New("the range list did not end after 10000 pages")
}

// leaseErr explains a failed lease service call.
func (c *clients) leaseErr(err error) error {
	return explain(err, "the lease service", c.leaseURL, "--lease or TENURECTL_LEASE")
}

// promoterErr explains a failed promoter call.
func (c *clients) promoterErr(err error) error {
	return explain(err, "the promoter", c.promoterURL, "--promoter or TENURECTL_PROMOTER")
}

// explain turns a Connect error into what happened and what to do.
func explain(err error, who, url, flagHint string) error {
	if setup := (tlsSetupError{}); errors.As(err, &setup) {
		return setup // nothing reached the server
	}
	if strings.HasPrefix(url, "http://") && tlshint.HungUp(err) {
		// Cleartext HTTP/2 to a TLS server: it hangs up on the preface.
		return fmt.Errorf("%s at %s hung up (%v): it probably runs mutual TLS; %s", who, url, connectMessage(err), passTLSFlags)
	}
	if tlshint.UnverifiedServer(err) {
		// An https:// URL: the server speaks TLS and this client trusts
		// no CA that signed its certificate. It was the bare "x509:
		// certificate signed by unknown authority", naming no flag.
		if transport.TLS() != nil {
			return fmt.Errorf("%s at %s presented a certificate this client does not accept (%v): --cacert must be the CA of that server's cluster (its ca.pem), and the URL a host name its certificate is for", who, url, connectMessage(err))
		}
		return fmt.Errorf("%s at %s runs TLS with a certificate this client cannot verify (%v): %s", who, url, connectMessage(err), passTLSFlags)
	}
	if tlshint.CleartextServer(err) {
		return fmt.Errorf("%s at %s answered in cleartext (%v): it runs without TLS (--insecure); drop --cacert, --cert and --key (and TENURECTL_CACERT, TENURECTL_CERT, TENURECTL_KEY)", who, url, connectMessage(err))
	}
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable:
		if isDialError(err) {
			return fmt.Errorf("cannot reach %s at %s (%v): is it running? 'make demo ARGS=--keep' starts a local cluster; otherwise pass %s", who, url, connectMessage(err), flagHint)
		}
	case connect.CodeUnauthenticated:
		return fmt.Errorf("%s at %s wants a client certificate signed by the cluster's CA (%v): pass --cacert, --cert and --key", who, url, connectMessage(err))
	case connect.CodePermissionDenied:
		return fmt.Errorf("%s at %s refused this certificate (%v): use one with the role the command needs (operator, for most)", who, url, connectMessage(err))
	case connect.CodeDeadlineExceeded:
		return fmt.Errorf("%s at %s did not answer within %v: it may be overloaded or partitioned; retry, or check its log", who, url, rpcTimeout)
	case connect.CodeUnimplemented, connect.CodeUnknown:
		if strings.Contains(err.Error(), "404") || connect.CodeOf(err) == connect.CodeUnimplemented {
			return fmt.Errorf("%s is not at %s (%v): check %s", who, url, connectMessage(err), flagHint)
		}
	}
	return fmt.Errorf("%s at %s: %v", who, url, err)
}

// passTLSFlags is what to do against a TLS server without a TLS setup.
const passTLSFlags = "pass --cacert (the cluster's ca.pem), --cert and --key (or TENURECTL_CACERT, TENURECTL_CERT, TENURECTL_KEY; 'tenure dev --keep' prints them)"

// isDialError reports whether this client failed to connect. An error the
// server sent is never one, whatever its message says: the promoter's
// "replica r5 at ... does not answer: dial tcp ...: connection refused"
// named a replica it could not reach, and was reported as "cannot reach
// the promoter".
func isDialError(err error) bool {
	if connect.IsWireError(err) {
		return false
	}
	s := err.Error()
	return strings.Contains(s, "connection refused") || strings.Contains(s, "no such host") || strings.Contains(s, "dial tcp")
}

func connectMessage(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Message()
	}
	return err.Error()
}

// memberStatus is one member replica's answer to GetStatus for a range.
type memberStatus struct {
	replica *tenurev1.Replica
	status  *tenurev1.RangeStatus // nil when err is set or the range is not hosted
	err     error
	// incarnation is the replica's own (its data directory's), when it
	// answered; lost is set when its disk lost the range (the membership
	// records another incarnation for it).
	incarnation string
	lost        *tenurev1.LostRange
	// pid and startedUnixMs name the replica's process, when it answered.
	pid, startedUnixMs int64
	// disk is the replica's full-disk state and space, when it answered.
	disk *tenurev1.DiskStatus
	// answeredAs is the id of the replica that answered at the member's
	// address ("" from a replica older than ids in its status).
	answeredAs string
}

// mismatch says whether the replica answering is not the member's disk.
func (m memberStatus) mismatch() bool {
	return m.lost != nil || (m.incarnation != "" && m.replica.GetIncarnation() != "" && m.incarnation != m.replica.GetIncarnation())
}

// lostRange finds rangeID among a replica's lost ranges.
func lostRange(resp *tenurev1.ReplicaServiceGetStatusResponse, rangeID string) *tenurev1.LostRange {
	for _, l := range resp.GetLostRanges() {
		if l.GetRangeId() == rangeID {
			return l
		}
	}
	return nil
}

// memberStatuses asks every member of r for its status of the range, in
// parallel, each call bounded. The answers are in membership order.
func (c *clients) memberStatuses(ctx context.Context, r *tenurev1.RangeInfo) []memberStatus {
	out := make([]memberStatus, len(r.GetReplicas()))
	var wg sync.WaitGroup
	for i, m := range r.GetReplicas() {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, rpcTimeout)
			defer cancel()
			resp, err := c.replica(m.GetAddress()).GetStatus(cctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: r.GetRangeId()}))
			if err != nil && connect.CodeOf(err) == connect.CodeNotFound {
				// Not hosted: a replica whose disk lost the range says so in
				// its full status.
				full, ferr := c.replica(m.GetAddress()).GetStatus(cctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{}))
				if ferr == nil {
					out[i] = memberFrom(m, r.GetRangeId(), full.Msg, nil)
				} else {
					out[i] = memberFrom(m, r.GetRangeId(), nil, nil)
				}
				return
			}
			if err != nil {
				out[i] = memberStatus{replica: m, err: err}
				return
			}
			var st *tenurev1.RangeStatus
			if len(resp.Msg.GetRanges()) == 1 {
				st = resp.Msg.GetRanges()[0]
			}
			out[i] = memberFrom(m, r.GetRangeId(), resp.Msg, st)
		})
	}
	wg.Wait()
	return out
}

// memberFrom is member m's status of range rangeID from what its replica
// answered: resp, its GetStatus (nil when only the range was asked for and
// it answered NotFound), and st, the range's status in it (nil when the
// replica does not host the range).
func memberFrom(m *tenurev1.Replica, rangeID string, resp *tenurev1.ReplicaServiceGetStatusResponse, st *tenurev1.RangeStatus) memberStatus {
	out := memberStatus{replica: m, status: st}
	if resp != nil {
		out.answeredAs = resp.GetReplicaId()
		out.incarnation, out.lost = resp.GetIncarnation(), lostRange(resp, rangeID)
		out.pid, out.startedUnixMs = resp.GetPid(), resp.GetStartedUnixMs()
		out.disk = resp.GetDisk()
	}
	switch {
	case out.answeredAs != "" && out.answeredAs != m.GetId():
		// Another replica serves at the member's address: it refuses
		// every call meant for the member, so the member can never be
		// fenced there. It read "does not host the range yet", while the
		// promoter held the range for want of a quorum.
		out.err = fmt.Errorf("MISDIRECTED: the address answers as replica %s; correct it with 'tenurectl range set-address'", out.answeredAs)
		out.status = nil
	case out.mismatch():
		out.err = fmt.Errorf("INCARNATION MISMATCH: the member is incarnation %s, the replica answering is %s (its disk was replaced or wiped); it does not serve the range: rebuild it from its peers with 'tenurectl range rebuild %s --replica %s'",
			orDash(m.GetIncarnation()), orDash(out.incarnation), rangeID, m.GetId())
		out.status = nil
	case st == nil:
		out.err = errors.New("does not host the range yet (no promotion has fenced it)")
	}
	return out
}

// replicaStatuses is every replica's whole GetStatus (every range it
// hosts), by address, for status of many ranges: one call a replica
// rather than one a member of each range. Asked one range at a time, a
// replica that does not answer cost rpcTimeout per range, 16 ranges at a
// time: five minutes of waiting at 1,000 ranges, in the incident status
// is run for.
type replicaStatuses map[string]*replicaAnswer

// replicaAnswer is one replica's GetStatus, its ranges by id, or why it
// did not answer.
type replicaAnswer struct {
	resp    *tenurev1.ReplicaServiceGetStatusResponse
	byRange map[string]*tenurev1.RangeStatus
	err     error
}

// allReplicaStatuses asks every address a member of ranges has for its
// whole status, in parallel (a bounded number at a time), each call
// bounded by rpcTimeout.
func (c *clients) allReplicaStatuses(ctx context.Context, ranges []*tenurev1.RangeInfo) replicaStatuses {
	var addrs []string
	out := replicaStatuses{}
	for _, r := range ranges {
		for _, m := range r.GetReplicas() {
			if _, ok := out[m.GetAddress()]; !ok {
				out[m.GetAddress()] = nil
				addrs = append(addrs, m.GetAddress())
			}
		}
	}
	answers := make([]*replicaAnswer, len(addrs))
	fanout.Run(len(addrs), 16, func(i int) {
		cctx, cancel := context.WithTimeout(ctx, rpcTimeout)
		defer cancel()
		resp, err := c.replica(addrs[i]).GetStatus(cctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{}))
		if err != nil {
			answers[i] = &replicaAnswer{err: err}
			return
		}
		a := &replicaAnswer{resp: resp.Msg, byRange: make(map[string]*tenurev1.RangeStatus, len(resp.Msg.GetRanges()))}
		for _, st := range resp.Msg.GetRanges() {
			a.byRange[st.GetRangeId()] = st
		}
		answers[i] = a
	})
	for i, a := range answers {
		out[addrs[i]] = a
	}
	return out
}

// members is r's member statuses as the replicas' whole statuses say, in
// membership order: what memberStatuses asks for range by range.
func (rs replicaStatuses) members(r *tenurev1.RangeInfo) []memberStatus {
	out := make([]memberStatus, len(r.GetReplicas()))
	for i, m := range r.GetReplicas() {
		a := rs[m.GetAddress()]
		if a.err != nil {
			out[i] = memberStatus{replica: m, err: a.err}
			continue
		}
		out[i] = memberFrom(m, r.GetRangeId(), a.resp, a.byRange[r.GetRangeId()])
	}
	return out
}

// leaderOf picks the replica serving as r's leader from the members'
// statuses: leading at the highest epoch, with a valid lease.
func leaderOf(sts []memberStatus) (memberStatus, bool) {
	var best memberStatus
	found := false
	for _, s := range sts {
		st := s.status
		if st == nil || st.GetRole() != tenurev1.Role_ROLE_LEADER || !st.GetLeaseValid() {
			continue
		}
		if !found || st.GetEpoch() > best.status.GetEpoch() {
			best, found = s, true
		}
	}
	return best, found
}

// findLeader finds the range's serving leader, asking the lease service
// for the membership and every member for its status. It waits for one
// (a promotion in progress) up to within.
func (c *clients) findLeader(ctx context.Context, rangeID string, within time.Duration) (*tenurev1.Replica, uint64, error) {
	l, err := c.findLeaderStatus(ctx, rangeID, within)
	if err != nil {
		return nil, 0, err
	}
	return l.replica, l.status.GetEpoch(), nil
}

// findLeaderStatus is findLeader with the leader's whole status of the
// range (its HWM, for a tail that starts beyond it).
func (c *clients) findLeaderStatus(ctx context.Context, rangeID string, within time.Duration) (memberStatus, error) {
	deadline := time.Now().Add(within)
	for {
		r, err := c.getRange(ctx, rangeID)
		if err != nil {
			return memberStatus{}, err
		}
		sts := c.memberStatuses(ctx, r)
		if l, ok := leaderOf(sts); ok {
			return l, nil
		}
		if time.Now().After(deadline) {
			return memberStatus{}, fmt.Errorf("range %s has no serving leader after %v (epoch %d): %s; 'tenurectl status %s' shows each replica, and the promoter promotes one once a quorum answers",
				rangeID, within, r.GetEpoch(), describeMembers(sts), rangeID)
		}
		select {
		case <-ctx.Done():
			return memberStatus{}, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// describeMembers says in one line what each member answered.
func describeMembers(sts []memberStatus) string {
	var parts []string
	for _, s := range sts {
		switch {
		case s.err != nil:
			parts = append(parts, fmt.Sprintf("%s %s", s.replica.GetId(), shortErr(s.err)))
		default:
			parts = append(parts, fmt.Sprintf("%s %s at epoch %d", s.replica.GetId(), roleName(s.status.GetRole()), s.status.GetEpoch()))
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, "; ")
}

func roleName(r tenurev1.Role) string {
	return strings.ToLower(strings.TrimPrefix(r.String(), "ROLE_"))
}

// shortErr is an error for a table cell or a one-line summary.
func shortErr(err error) string {
	if isDialError(err) {
		return "unreachable"
	}
	return shortText(connectMessage(err))
}

// shortText cuts s to one table cell: at most 80 bytes.
func shortText(s string) string {
	if len(s) > 80 {
		s = s[:77] + "..."
	}
	return s
}
