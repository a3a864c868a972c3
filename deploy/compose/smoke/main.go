// Command smoke is the client half of deploy/compose/smoke.sh: small,
// bounded steps against a compose stack, run inside the stack's network (the
// replicas advertise their compose hostnames). The shell script does the
// orchestration (compose up, docker kill, teardown); this program only talks
// to tenure and Jaeger. Every step retries until its --timeout and then fails.
//
//	smoke create     --lease URL --range R --replicas id=url,...
//	smoke leader     --lease URL --range R [--min-epoch E] [--not ID]
//	smoke produce    --lease URL --range R --count N --tag T     (acked "offset value" lines on stdout)
//	smoke verify     --lease URL --range R < acked               (every acked record readable, same offset and bytes)
//	smoke transition --promoters URL,... --range R --epoch E     (the transition record of epoch E; prints its trace id)
//	smoke trace      --jaeger URL --trace-id ID --span NAME[=MIN],...  (the trace is in Jaeger with those spans)
//	smoke rejoin     --lease URL --range R --replica URL --epoch E (a restarted replica follows at E and has caught up)
//	smoke refused    --range R --replica URL                      (a Truncate without a client certificate is Unauthenticated and changes nothing)
//	smoke metrics    --urls URL,... [--under-replicated N] [--leaders N] [--promoted-min N]
//	                 (every URL serves Prometheus metrics; summed over them, the series have those values)
//
// With SMOKE_TLS_CA, SMOKE_TLS_CERT and SMOKE_TLS_KEY set (smoke.sh mounts
// the stack's certificates and passes the operator's, which can also append
// and read), every call is mutual TLS and http:// URLs mean https://.
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/internal/metrics"
	"github.com/tenurelog/tenure/pkg/auth"
	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

var steps = map[string]func(ctx context.Context, args []string) error{
	"create":     create,
	"leader":     leader,
	"produce":    produce,
	"verify":     verify,
	"transition": transition,
	"trace":      traceStep,
	"rejoin":     rejoin,
	"refused":    refused,
	"metrics":    metricsStep,
}

func main() {
	if len(os.Args) < 2 || steps[os.Args[1]] == nil {
		fmt.Fprintln(os.Stderr, "usage: smoke create|leader|produce|verify|transition|trace|rejoin [flags] (see the package comment)")
		os.Exit(2)
	}
	if f := (auth.Files{CA: os.Getenv("SMOKE_TLS_CA"), Cert: os.Getenv("SMOKE_TLS_CERT"), Key: os.Getenv("SMOKE_TLS_KEY")}); f.Configured() {
		src, err := auth.Load(f, nil)
		if err != nil {
			fmt.Fprintf(os.Stderr, "smoke: %v\n", err)
			os.Exit(1)
		}
		transport.SetTLS(src)
	}
	httpClient = transport.NewHTTPClient()
	if err := steps[os.Args[1]](context.Background(), os.Args[2:]); err != nil {
		fmt.Fprintf(os.Stderr, "smoke %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

// common flags.
type opts struct {
	fs      *flag.FlagSet
	lease   *string
	rng     *string
	timeout *time.Duration
}

func newOpts(name string) *opts {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	return &opts{
		fs:      fs,
		lease:   fs.String("lease", "http://lease-1:7000", "lease service URL"),
		rng:     fs.String("range", "smoke", "range id"),
		timeout: fs.Duration("timeout", 60*time.Second, "give up after this long"),
	}
}

func (o *opts) parse(args []string) (context.Context, context.CancelFunc, error) {
	if err := o.fs.Parse(args); err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), *o.timeout)
	return ctx, cancel, nil
}

// httpClient is made in main, after the TLS identity is installed.
var httpClient *http.Client

// svc is a base URL as given, upgraded to https when the smoke client
// speaks TLS (the flags' defaults say http).
func svc(url string) string {
	if transport.TLS() != nil {
		if rest, ok := strings.CutPrefix(url, "http://"); ok {
			return "https://" + rest
		}
	}
	return url
}

func leaseClient(url string) tenurev1connect.LeaseServiceClient {
	return tenurev1connect.NewLeaseServiceClient(httpClient, svc(url), transport.ClientOptions()...)
}

func logClient(url string) tenurev1connect.LogServiceClient {
	return tenurev1connect.NewLogServiceClient(httpClient, svc(url), transport.ClientOptions()...)
}

// retry runs f until it returns nil or ctx ends, logging each new error.
func retry(ctx context.Context, what string, f func(ctx context.Context) error) error {
	var last string
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := f(cctx)
		cancel()
		if err == nil {
			return nil
		}
		var stop backoffStop
		if errors.As(err, &stop) {
			return fmt.Errorf("%s: %w", what, stop.error)
		}
		if msg := err.Error(); msg != last {
			fmt.Fprintf(os.Stderr, "smoke: %s: %v (retrying)\n", what, err)
			last = msg
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: gave up: %w", what, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func create(_ context.Context, args []string) error {
	o := newOpts("create")
	replicas := o.fs.String("replicas", "", "id=url,... (required)")
	ctx, cancel, err := o.parse(args)
	if err != nil {
		return err
	}
	defer cancel()
	req := &tenurev1.CreateRangeRequest{RangeId: *o.rng}
	for _, kv := range strings.Split(*replicas, ",") {
		id, url, ok := strings.Cut(kv, "=")
		if !ok {
			return fmt.Errorf("--replicas: %q is not id=url", kv)
		}
		req.Replicas = append(req.Replicas, &tenurev1.Replica{Id: id, Address: url})
	}
	lc := leaseClient(*o.lease)
	return retry(ctx, "create range", func(ctx context.Context) error {
		_, err := lc.CreateRange(ctx, connect.NewRequest(req))
		if connect.CodeOf(err) == connect.CodeAlreadyExists {
			err = nil
		}
		if err == nil {
			fmt.Printf("created range %s with %d replicas\n", *o.rng, len(req.Replicas))
		}
		return err
	})
}

// currentLeader asks the lease service for the range's live lease holder.
func currentLeader(ctx context.Context, lc tenurev1connect.LeaseServiceClient, rng string) (id, addr string, epoch uint64, err error) {
	resp, err := lc.GetRange(ctx, connect.NewRequest(&tenurev1.GetRangeRequest{RangeId: rng}))
	if err != nil {
		return "", "", 0, err
	}
	r := resp.Msg.GetRange()
	l := r.GetLease()
	if l == nil || !l.GetLive() || l.GetEpoch() != r.GetEpoch() || l.GetHolderAddress() == "" {
		return "", "", r.GetEpoch(), fmt.Errorf("range %s at epoch %d has no live leader lease yet (lease %v)", rng, r.GetEpoch(), l)
	}
	isReplica := false
	for _, rep := range r.GetReplicas() {
		isReplica = isReplica || rep.GetId() == l.GetHolderId()
	}
	if !isReplica {
		return "", "", r.GetEpoch(), fmt.Errorf("range %s epoch %d is held by %s, not a replica (promotion in progress)", rng, r.GetEpoch(), l.GetHolderId())
	}
	return l.GetHolderId(), l.GetHolderAddress(), r.GetEpoch(), nil
}

func leader(_ context.Context, args []string) error {
	o := newOpts("leader")
	minEpoch := o.fs.Uint64("min-epoch", 1, "wait for at least this epoch")
	not := o.fs.String("not", "", "wait for a leader other than this replica")
	ctx, cancel, err := o.parse(args)
	if err != nil {
		return err
	}
	defer cancel()
	lc := leaseClient(*o.lease)
	return retry(ctx, "find leader", func(ctx context.Context) error {
		id, addr, epoch, err := currentLeader(ctx, lc, *o.rng)
		if err != nil {
			return err
		}
		if epoch < *minEpoch || id == *not {
			return fmt.Errorf("leader %s at epoch %d, waiting for epoch >= %d and a leader other than %q", id, epoch, *minEpoch, *not)
		}
		// The leader serves reads once adopted: that is the real readiness.
		if _, err := logClient(addr).Read(ctx, connect.NewRequest(&tenurev1.ReadRequest{RangeId: *o.rng, MaxRecords: 1})); err != nil {
			return fmt.Errorf("leader %s (%s) epoch %d not serving yet: %w", id, addr, epoch, err)
		}
		fmt.Printf("%s %d\n", id, epoch)
		return nil
	})
}

func produce(_ context.Context, args []string) error {
	o := newOpts("produce")
	count := o.fs.Int("count", 100, "records to have acknowledged")
	batch := o.fs.Int("batch", 10, "records per append")
	tag := o.fs.String("tag", "a", "value prefix: values are TAG-<n>")
	ctx, cancel, err := o.parse(args)
	if err != nil {
		return err
	}
	defer cancel()
	lc := leaseClient(*o.lease)
	for n := 0; n < *count; {
		k := min(*batch, *count-n)
		values := make([][]byte, k)
		for i := range values {
			values[i] = fmt.Appendf(nil, "%s-%d", *tag, n+i)
		}
		var resp *tenurev1.AppendResponse
		// A failed append's outcome is unknown; retrying may store the batch
		// twice, which is fine: only acknowledged offsets are checked.
		err := retry(ctx, "append", func(ctx context.Context) error {
			_, addr, _, err := currentLeader(ctx, lc, *o.rng)
			if err != nil {
				return err
			}
			r, err := logClient(addr).Append(ctx, connect.NewRequest(&tenurev1.AppendRequest{RangeId: *o.rng, Records: values}))
			if err != nil {
				return err
			}
			resp = r.Msg
			return nil
		})
		if err != nil {
			return fmt.Errorf("after %d acknowledged records: %w", n, err)
		}
		for i, v := range values {
			fmt.Printf("%d %s\n", resp.GetBaseOffset()+uint64(i), v)
		}
		n += k
	}
	fmt.Fprintf(os.Stderr, "smoke: produced %d acknowledged records tagged %s\n", *count, *tag)
	return nil
}

func verify(_ context.Context, args []string) error {
	o := newOpts("verify")
	ctx, cancel, err := o.parse(args)
	if err != nil {
		return err
	}
	defer cancel()
	want := map[uint64]string{}
	var maxOff uint64
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		off, val, ok := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(off, 10, 64)
		if err != nil {
			return fmt.Errorf("acked line %q: %v", sc.Text(), err)
		}
		if prev, dup := want[n]; dup && prev != val {
			return fmt.Errorf("offset %d acknowledged twice, as %q and %q", n, prev, val)
		}
		want[n] = val
		maxOff = max(maxOff, n)
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if len(want) == 0 {
		return errors.New("no acknowledged records on stdin")
	}
	lc := leaseClient(*o.lease)
	return retry(ctx, "verify", func(ctx context.Context) error {
		id, addr, epoch, err := currentLeader(ctx, lc, *o.rng)
		if err != nil {
			return err
		}
		got := map[uint64]string{}
		var off uint64
		for off <= maxOff {
			resp, err := logClient(addr).Read(ctx, connect.NewRequest(&tenurev1.ReadRequest{RangeId: *o.rng, Offset: off}))
			if err != nil {
				return fmt.Errorf("read at %d from %s: %w", off, id, err)
			}
			recs := resp.Msg.GetRecords()
			if len(recs) == 0 {
				return fmt.Errorf("leader %s (epoch %d) has HWM %d, below acknowledged offset %d", id, epoch, resp.Msg.GetHighWaterMark(), maxOff)
			}
			for _, r := range recs {
				if !r.GetEpochStart() {
					got[r.GetOffset()] = string(r.GetValue())
				}
				off = r.GetOffset() + 1
			}
		}
		var missing []string
		for o, v := range want {
			if got[o] != v {
				missing = append(missing, fmt.Sprintf("offset %d: want %q, got %q", o, v, got[o]))
			}
		}
		if len(missing) > 0 {
			sort.Strings(missing)
			// A mismatch is a lost acknowledged record: fail at once.
			return backoffStop{fmt.Errorf("LOST %d acknowledged records on leader %s epoch %d: %s", len(missing), id, epoch, strings.Join(missing[:min(10, len(missing))], "; "))}
		}
		fmt.Printf("verified: all %d acknowledged records (offsets up to %d) readable on leader %s at epoch %d\n", len(want), maxOff, id, epoch)
		return nil
	})
}

// backoffStop is an error retry returns at once instead of retrying.
type backoffStop struct{ error }

func transition(_ context.Context, args []string) error {
	o := newOpts("transition")
	promoters := o.fs.String("promoters", "http://promoter-1:7200,http://promoter-2:7200", "promoter URLs; any answers")
	epoch := o.fs.Uint64("epoch", 0, "the transition's epoch (required)")
	ctx, cancel, err := o.parse(args)
	if err != nil {
		return err
	}
	defer cancel()
	return retry(ctx, "transition record", func(ctx context.Context) error {
		var errs []error
		for _, url := range strings.Split(*promoters, ",") {
			pc := tenurev1connect.NewPromoterServiceClient(httpClient, svc(url), transport.ClientOptions()...)
			resp, err := pc.ListTransitions(ctx, connect.NewRequest(&tenurev1.ListTransitionsRequest{RangeId: *o.rng}))
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", url, err))
				continue
			}
			for _, t := range resp.Msg.GetTransitions() {
				if t.GetEpoch() != *epoch {
					continue
				}
				var fenced []string
				for _, r := range t.GetReplicas() {
					fenced = append(fenced, fmt.Sprintf("%s(fenced=%t end=%d hwm=%d last_epoch=%d)", r.GetReplicaId(), r.GetFenced(), r.GetLogEnd(), r.GetHighWaterMark(), r.GetLastEpoch()))
				}
				fmt.Fprintf(os.Stderr, "smoke: transition epoch %d (from %d): leader %s, reason %q, committed bound %d, %d truncations, %dus, promoter %s, replicas %s\n",
					t.GetEpoch(), t.GetPreviousEpoch(), t.GetLeaderId(), t.GetReason(), t.GetCommittedBound(), len(t.GetTruncations()), t.GetDurationUs(), t.GetPromoterId(), strings.Join(fenced, " "))
				fmt.Println(t.GetTraceId())
				return nil
			}
			errs = append(errs, fmt.Errorf("%s: no transition at epoch %d among %d", url, *epoch, len(resp.Msg.GetTransitions())))
		}
		return errors.Join(errs...)
	})
}

func traceStep(_ context.Context, args []string) error {
	fs := flag.NewFlagSet("trace", flag.ContinueOnError)
	jaeger := fs.String("jaeger", "http://jaeger:16686", "Jaeger query base URL")
	id := fs.String("trace-id", "", "trace id, hex (required)")
	spans := fs.String("span", "promote,fence", "comma-separated span names the trace must contain, each as NAME or NAME=MIN (at least MIN such spans)")
	timeout := fs.Duration("timeout", 60*time.Second, "give up after this long")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if strings.Trim(*id, "0") == "" {
		return fmt.Errorf("no trace id (%q): the transition record carries none", *id)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	return retry(ctx, "trace "+*id, func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, *jaeger+"/api/traces/"+*id, nil)
		if err != nil {
			return backoffStop{err}
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET /api/traces/%s: %s: %.200s", *id, resp.Status, body)
		}
		var tr struct {
			Data []struct {
				Spans []struct {
					OperationName string `json:"operationName"`
					ProcessID     string `json:"processID"`
				} `json:"spans"`
				Processes map[string]struct {
					ServiceName string `json:"serviceName"`
				} `json:"processes"`
			} `json:"data"`
		}
		if err := json.Unmarshal(body, &tr); err != nil {
			return fmt.Errorf("decode trace: %w", err)
		}
		names := map[string]int{}
		services := map[string]bool{}
		for _, t := range tr.Data {
			for _, s := range t.Spans {
				names[s.OperationName]++
				services[t.Processes[s.ProcessID].ServiceName] = true
			}
		}
		var missing []string
		for _, want := range strings.Split(*spans, ",") {
			name, n, _ := strings.Cut(want, "=")
			atLeast, err := strconv.Atoi(n)
			if n == "" || err != nil {
				atLeast = 1
			}
			if names[name] < atLeast {
				missing = append(missing, fmt.Sprintf("%s (%d of at least %d)", name, names[name], atLeast))
			}
		}
		summary := make([]string, 0, len(names))
		for n, c := range names {
			summary = append(summary, fmt.Sprintf("%s x%d", n, c))
		}
		sort.Strings(summary)
		svcs := make([]string, 0, len(services))
		for s := range services {
			svcs = append(svcs, s)
		}
		sort.Strings(svcs)
		if len(missing) > 0 {
			return fmt.Errorf("trace %s lacks spans %v so far (has: %s)", *id, missing, strings.Join(summary, ", "))
		}
		fmt.Printf("trace %s in Jaeger: services [%s]; spans: %s\n", *id, strings.Join(svcs, " "), strings.Join(summary, ", "))
		return nil
	})
}

func replicaStatus(ctx context.Context, url, rng string) (*tenurev1.RangeStatus, error) {
	rc := tenurev1connect.NewReplicaServiceClient(httpClient, svc(url), transport.ClientOptions()...)
	resp, err := rc.GetStatus(ctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: rng}))
	if err != nil {
		return nil, err
	}
	for _, r := range resp.Msg.GetRanges() {
		if r.GetRangeId() == rng {
			return r, nil
		}
	}
	return nil, fmt.Errorf("%s does not host range %s", url, rng)
}

// rejoin waits until a restarted replica follows the range at --epoch or
// later and holds exactly the leader's log (log end and HWM), with nothing
// being appended meanwhile.
func rejoin(_ context.Context, args []string) error {
	o := newOpts("rejoin")
	url := o.fs.String("replica", "", "the restarted replica's URL (required)")
	epoch := o.fs.Uint64("epoch", 1, "the epoch it must follow at, at least")
	ctx, cancel, err := o.parse(args)
	if err != nil {
		return err
	}
	defer cancel()
	lc := leaseClient(*o.lease)
	return retry(ctx, "rejoin "+*url, func(ctx context.Context) error {
		id, addr, _, err := currentLeader(ctx, lc, *o.rng)
		if err != nil {
			return err
		}
		ls, err := replicaStatus(ctx, addr, *o.rng)
		if err != nil {
			return fmt.Errorf("leader %s: %w", id, err)
		}
		rs, err := replicaStatus(ctx, *url, *o.rng)
		if err != nil {
			return err
		}
		if rs.GetRole() != tenurev1.Role_ROLE_FOLLOWER || rs.GetEpoch() < *epoch || rs.GetLeaderId() != id ||
			rs.GetLogEnd() != ls.GetLogEnd() || rs.GetHighWaterMark() != ls.GetHighWaterMark() {
			return fmt.Errorf("%s: %s at epoch %d following %q, log end %d HWM %d; leader %s: log end %d HWM %d",
				*url, rs.GetRole(), rs.GetEpoch(), rs.GetLeaderId(), rs.GetLogEnd(), rs.GetHighWaterMark(), id, ls.GetLogEnd(), ls.GetHighWaterMark())
		}
		fmt.Printf("rejoined: %s follows %s at epoch %d with log end %d and HWM %d, the same as the leader\n",
			*url, id, rs.GetEpoch(), rs.GetLogEnd(), rs.GetHighWaterMark())
		return nil
	})
}

// refused proves the stack's replicas turn away a stranger: a Truncate to 0
// from a client that trusts the CA but presents no certificate is answered
// Unauthenticated, and the replica's log end, HWM and fenced epoch are as
// they were.
func refused(_ context.Context, args []string) error {
	o := newOpts("refused")
	url := o.fs.String("replica", "", "a replica's URL (required)")
	ctx, cancel, err := o.parse(args)
	if err != nil {
		return err
	}
	defer cancel()
	src := transport.TLS()
	if src == nil {
		return errors.New("refused needs SMOKE_TLS_*: the stack runs mutual TLS")
	}
	before, err := replicaStatus(ctx, *url, *o.rng)
	if err != nil {
		return err
	}
	// Trusts the CA, presents nothing: what anyone on the network can do.
	cfg := src.ClientConfig()
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &tls.Certificate{}, nil }
	var p http.Protocols
	p.SetHTTP2(true)
	stranger := tenurev1connect.NewReplicaServiceClient(&http.Client{Transport: &http.Transport{Protocols: &p, TLSClientConfig: cfg}}, svc(*url), transport.ClientOptions()...)
	_, err = stranger.Truncate(ctx, connect.NewRequest(&tenurev1.TruncateRequest{RangeId: *o.rng, Epoch: before.GetFencedEpoch(), TargetOffset: 0}))
	code := connect.CodeOf(err)
	if code != connect.CodeUnauthenticated {
		return fmt.Errorf("Truncate(%s, epoch %d, to 0) without a certificate = %v, want unauthenticated", *o.rng, before.GetFencedEpoch(), err)
	}
	after, err := replicaStatus(ctx, *url, *o.rng)
	if err != nil {
		return err
	}
	if after.GetLogEnd() != before.GetLogEnd() || after.GetHighWaterMark() < before.GetHighWaterMark() || after.GetFencedEpoch() != before.GetFencedEpoch() {
		return fmt.Errorf("after the refused Truncate: log end %d -> %d, HWM %d -> %d, fenced epoch %d -> %d",
			before.GetLogEnd(), after.GetLogEnd(), before.GetHighWaterMark(), after.GetHighWaterMark(), before.GetFencedEpoch(), after.GetFencedEpoch())
	}
	fmt.Printf("refused: Truncate without a certificate on %s answered %v; log end %d, HWM %d, fenced epoch %d unchanged\n",
		*url, code, after.GetLogEnd(), after.GetHighWaterMark(), after.GetFencedEpoch())
	return nil
}

// metricsStep scrapes every --urls (plaintext: the metrics listeners take
// no certificate) and checks, summed over them, the series named by the
// flags that are set (-1: not checked), retrying until they hold: how many
// ranges are under-replicated (tenure_replica_under_replicated_ranges), how
// many replicas lead (tenure_replica_ranges{role="leader"}), and at least
// how many promotions succeeded (tenure_promoter_promotions_total with
// outcome "promoted"). Each URL must answer with tenure_build_info.
func metricsStep(_ context.Context, args []string) error {
	o := newOpts("metrics")
	urls := o.fs.String("urls", "", "comma-separated metrics URLs (required)")
	under := o.fs.Int("under-replicated", -1, "want this many under-replicated ranges in all")
	leaders := o.fs.Int("leaders", -1, "want this many ranges led in all")
	promoted := o.fs.Int("promoted-min", -1, "want at least this many successful promotions in all")
	ctx, cancel, err := o.parse(args)
	if err != nil {
		return err
	}
	defer cancel()
	if *urls == "" {
		return errors.New("--urls is required")
	}
	plain := &http.Client{Timeout: 5 * time.Second}
	return retry(ctx, "metrics", func(ctx context.Context) error {
		var u, l, p float64
		for _, url := range strings.Split(*urls, ",") {
			s, err := metrics.Scrape(ctx, plain, url)
			if err != nil {
				return err
			}
			if s.Sum("tenure_build_info") != 1 {
				return fmt.Errorf("%s: no tenure_build_info", url)
			}
			u += s.Sum("tenure_replica_under_replicated_ranges")
			l += s.Sum(`tenure_replica_ranges{role="leader"}`)
			for k, v := range s {
				if strings.HasPrefix(k, "tenure_promoter_promotions_total{") && strings.Contains(k, `outcome="promoted"`) {
					p += v
				}
			}
		}
		if (*under >= 0 && u != float64(*under)) || (*leaders >= 0 && l != float64(*leaders)) || (*promoted >= 0 && p < float64(*promoted)) {
			return fmt.Errorf("under-replicated %v (want %d), leaders %v (want %d), promoted %v (want at least %d; -1: any)", u, *under, l, *leaders, p, *promoted)
		}
		fmt.Printf("metrics of %d services: under-replicated ranges %v, ranges led %v, promotions %v\n", len(strings.Split(*urls, ",")), u, l, p)
		return nil
	})
}
