package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/internal/table"
	"github.com/tenurelog/tenure/pkg/transport"
	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

const rangeCreateHelp = `
Register a range and its replica set with the lease service. The range starts
at epoch 0 with no leader; the promoter notices it and promotes its first
leader (the preferred replica, if it is among the most complete).

--replicas names each member and the base URL it serves on, e.g.
  --replicas r1=http://127.0.0.1:7101,r2=http://127.0.0.1:7102,r3=http://127.0.0.1:7103
Three or five replicas tolerate one or two failures.

Without retention flags the range gets the default policy, stored with it:
records older than 7 days are removed, size unlimited. Change it later with
'tenurectl range set'.
`

func runRangeCreate(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "range create", "ID --replicas ID=URL,... [--preferred ID] [--retention-bytes SIZE] [--retention-age AGE]", rangeCreateHelp+retentionFlagsHelp)
	o := addClusterFlags(e, fs)
	replicas := fs.String("replicas", "", "the replica set: ID=URL pairs, comma-separated (required)")
	preferred := fs.String("preferred", "", "replica to prefer as leader among equally complete ones")
	def := wire.DefaultRetention()
	ret := addRetentionFlags(fs, "keep at most `SIZE` bytes of the newest records (64KiB, 1GiB, ...; 0 or unlimited: no limit) (default "+formatSize(def.GetMaxBytes())+")",
		"remove records older than `AGE` (7d, 12h, ...; 0 or unlimited: no limit) (default "+formatAge(def.GetMaxAgeMs())+")")
	positional, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(positional) != 1 {
		return usagef("want exactly one range ID, got %d arguments", len(positional))
	}
	members, err := parseReplicas("--replicas", *replicas, o.tls())
	if err != nil {
		return err
	}
	if *preferred != "" && !hasMember(members, *preferred) {
		return usagef("--preferred %s is not one of --replicas", *preferred)
	}
	c := newClients(o)
	defer c.close()
	cctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	req := &tenurev1.CreateRangeRequest{RangeId: positional[0], Replicas: members, PreferredReplicaId: *preferred}
	if ret.any() {
		// A flag not given keeps its default.
		req.Retention = ret.apply(wire.DefaultRetention())
	}
	resp, err := c.lease.CreateRange(cctx, connect.NewRequest(req))
	switch connect.CodeOf(err) {
	case connect.CodeAlreadyExists:
		return fmt.Errorf("range %q already exists; 'tenurectl status %s' shows it", positional[0], positional[0])
	case connect.CodeInvalidArgument:
		return fmt.Errorf("the lease service refused the range: %s", connectMessage(err))
	}
	if err != nil {
		return c.leaseErr(err)
	}
	if *o.json {
		return writeProtoJSON(e.stdout, resp.Msg.GetRange())
	}
	r := resp.Msg.GetRange()
	fmt.Fprintf(e.stdout, "created range %s with replicas %s", r.GetRangeId(), describeReplicas(r.GetReplicas()))
	if r.GetPreferredReplicaId() != "" {
		fmt.Fprintf(e.stdout, ", preferred leader %s", r.GetPreferredReplicaId())
	}
	fmt.Fprintf(e.stdout, "\nretention %s", describeRetention(r.GetRetention()))
	fmt.Fprintf(e.stdout, "\nepoch 0, no leader yet: the promoter promotes one shortly ('tenurectl status %s' shows it)\n", r.GetRangeId())
	return nil
}

// parseReplicas parses "r1=http://...,r2=HOST:PORT,...", each URL by
// transport.BaseURL's rule (tls: the command's calls are mutual TLS). what
// names the argument in errors ("--replicas", "--add").
func parseReplicas(what, s string, tls bool) ([]*tenurev1.Replica, error) {
	if strings.TrimSpace(s) == "" {
		return nil, usagef("--replicas is required: ID=URL pairs, e.g. r1=http://127.0.0.1:7101,r2=http://127.0.0.1:7102")
	}
	var out []*tenurev1.Replica
	for _, part := range strings.Split(s, ",") {
		id, url, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || id == "" || url == "" {
			return nil, usagef("%s: %q is not ID=URL", what, part)
		}
		url, err := transport.BaseURL(url, tls)
		if err != nil {
			return nil, usagef("%s: %s: %v", what, id, err)
		}
		if hasMember(out, id) {
			return nil, usagef("%s names %s twice", what, id)
		}
		out = append(out, &tenurev1.Replica{Id: id, Address: url})
	}
	return out, nil
}

func hasMember(rs []*tenurev1.Replica, id string) bool {
	for _, r := range rs {
		if r.GetId() == id {
			return true
		}
	}
	return false
}

func describeReplicas(rs []*tenurev1.Replica) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = r.GetId() + "=" + r.GetAddress()
	}
	return strings.Join(parts, ",")
}

const rangeListHelp = `
List every range the lease service knows: its epoch, the holder of its lease
(the leader, or a promoter mid-promotion), whether that lease is live, the
retention policy (size or age limit: "64KiB or 7d", "unlimited") and the
replica set.
`

func runRangeList(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "range list", "", rangeListHelp)
	o := addClusterFlags(e, fs)
	positional, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(positional) != 0 {
		return usagef("takes no arguments, got %d", len(positional))
	}
	c := newClients(o)
	defer c.close()
	ranges, err := c.listRanges(ctx)
	if err != nil {
		return err
	}
	if *o.json {
		return writeProtoJSONList(e.stdout, ranges)
	}
	return writeRangeList(e.stdout, ranges)
}

func writeRangeList(w io.Writer, ranges []*tenurev1.RangeInfo) error {
	if len(ranges) == 0 {
		fmt.Fprintln(w, "no ranges; 'tenurectl range create' makes one")
		return nil
	}
	tw := table.New(w, 2)
	fmt.Fprintf(tw, "RANGE\tEPOCH\tLEASE HOLDER\tLEASE\tPREFERRED\tRETENTION\tREPLICAS\n")
	for _, r := range ranges {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", r.GetRangeId(), r.GetEpoch(), orDash(r.GetLease().GetHolderId()),
			leaseState(r.GetLease()), orDash(r.GetPreferredReplicaId()), describeRetention(r.GetRetention()), describeReplicas(r.GetReplicas()))
	}
	return tw.Flush()
}

// leaseState describes a lease in a few words.
func leaseState(l *tenurev1.Lease) string {
	switch {
	case l.GetEpoch() == 0:
		return "none"
	case l.GetLive():
		return fmt.Sprintf("live (%.1fs left)", float64(l.GetTtlRemainingMs())/1000)
	default:
		return "expired"
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
