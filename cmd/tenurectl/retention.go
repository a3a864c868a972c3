package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/internal/bytesize"
	"github.com/tenurelog/tenure/internal/table"
	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// retentionFlagsHelp is the part of range create's and range set's help
// that explains the two flags; the README's "Retention" section says the same.
const retentionFlagsHelp = `
Retention: the range's leader removes committed records (only ever below the
high-water mark) that fall outside either limit, whole batches at a time,
every retention interval of its replica (tenure replica --retention-interval,
30s by default); followers follow the leader's log start. Reads below the
log start answer OutOfRange naming it.
  --retention-bytes SIZE   keep at most SIZE of the newest stored batches:
                           a byte count or a size such as 64KiB, 512MiB,
                           1GiB, 10GB (KiB/MiB/GiB/TiB are powers of 1024,
                           KB/MB/GB/TB of 1000); 0 or "unlimited": no limit
  --retention-age AGE      remove records written more than AGE ago: e.g.
                           7d, 12h, 90m, 1d12h, 30s, 500ms (at most 100y);
                           0 or "unlimited": no limit
`

// sizeFlag is --retention-bytes: a size, and whether it was given.
type sizeFlag struct {
	set bool
	n   uint64
}

func (f *sizeFlag) String() string {
	if f == nil || !f.set {
		return ""
	}
	return formatSize(f.n)
}

func (f *sizeFlag) Set(s string) error {
	n, err := parseSize(s)
	if err != nil {
		return err
	}
	f.set, f.n = true, n
	return nil
}

// ageFlag is --retention-age: an age in milliseconds, and whether it was given.
type ageFlag struct {
	set bool
	ms  int64
}

func (f *ageFlag) String() string {
	if f == nil || !f.set {
		return ""
	}
	return formatAge(f.ms)
}

func (f *ageFlag) Set(s string) error {
	ms, err := parseAge(s)
	if err != nil {
		return err
	}
	f.set, f.ms = true, ms
	return nil
}

// retentionFlags are the two retention flags of a command.
type retentionFlags struct {
	bytes sizeFlag
	age   ageFlag
}

func addRetentionFlags(fs *flag.FlagSet, bytesUsage, ageUsage string) *retentionFlags {
	r := &retentionFlags{}
	fs.Var(&r.bytes, "retention-bytes", bytesUsage)
	fs.Var(&r.age, "retention-age", ageUsage)
	return r
}

// apply returns base with the flags that were given replacing its fields.
func (r *retentionFlags) apply(base *tenurev1.RetentionPolicy) *tenurev1.RetentionPolicy {
	p := &tenurev1.RetentionPolicy{MaxBytes: base.GetMaxBytes(), MaxAgeMs: base.GetMaxAgeMs()}
	if r.bytes.set {
		p.MaxBytes = r.bytes.n
	}
	if r.age.set {
		p.MaxAgeMs = r.age.ms
	}
	return p
}

func (r *retentionFlags) any() bool { return r.bytes.set || r.age.set }

// parseSize reads a byte count (internal/bytesize): "65536", "64KiB",
// "1.5GiB", "10GB", "0" or "unlimited" (0).
func parseSize(s string) (uint64, error) { return bytesize.Parse(s) }

// formatSize prints a size exactly (bytesize.Format), "unlimited" for 0
// and a bare count of bytes with a "B": what parseSize reads back.
func formatSize(n uint64) string {
	if n == 0 {
		return "unlimited"
	}
	f := bytesize.Format(n)
	if f == strconv.FormatUint(n, 10) {
		return f + "B"
	}
	return f
}

// ageUnits are the age units parseAge knows, in milliseconds.
var ageUnits = map[string]int64{
	"ms": 1, "s": 1000, "m": 60 * 1000, "h": 3600 * 1000, "d": 24 * 3600 * 1000, "w": 7 * 24 * 3600 * 1000, "y": 365 * 24 * 3600 * 1000,
}

// parseAge reads an age: one or more number+unit terms ("7d", "1d12h",
// "90m", "1.5h", "500ms"; units ms, s, m, h, d, w, y), "0" or "unlimited"
// (0). The result is whole milliseconds, at least 1ms unless 0, at most
// wire.MaxRetentionAgeMs.
func parseAge(s string) (int64, error) {
	in := strings.TrimSpace(s)
	low := strings.ToLower(in)
	if low == "unlimited" || low == "0" {
		return 0, nil
	}
	bad := func() error {
		return fmt.Errorf("age %q: want a duration such as 7d, 12h, 90m, 1d12h or 500ms (units ms, s, m, h, d, w, y), or 0/unlimited", s)
	}
	if low == "" {
		return 0, bad()
	}
	if strings.HasPrefix(low, "-") {
		return 0, fmt.Errorf("age %q is negative; 0 or unlimited means no limit", s)
	}
	var total float64
	rest := low
	for rest != "" {
		i := 0
		for i < len(rest) && (rest[i] >= '0' && rest[i] <= '9' || rest[i] == '.') {
			i++
		}
		j := i
		for j < len(rest) && rest[j] >= 'a' && rest[j] <= 'z' {
			j++
		}
		if i == 0 || j == i {
			return 0, bad()
		}
		n, err := strconv.ParseFloat(rest[:i], 64)
		unit, ok := ageUnits[rest[i:j]]
		if err != nil || !ok {
			return 0, bad()
		}
		total += n * float64(unit)
		rest = rest[j:]
	}
	if total > float64(wire.MaxRetentionAgeMs) {
		return 0, fmt.Errorf("age %q is more than 100 years; use 0 or unlimited for no limit", s)
	}
	ms := int64(math.Round(total))
	if ms == 0 && total > 0 {
		return 0, fmt.Errorf("age %q is under a millisecond; use 0 or unlimited for no limit", s)
	}
	return ms, nil
}

// formatAge prints an age in days, hours, minutes, seconds and milliseconds
// ("7d", "1d12h", "90s" as "1m30s"): what parseAge reads back.
func formatAge(ms int64) string {
	if ms <= 0 {
		return "unlimited"
	}
	var b strings.Builder
	for _, u := range []struct {
		suffix string
		ms     int64
	}{{"d", 24 * 3600 * 1000}, {"h", 3600 * 1000}, {"m", 60 * 1000}, {"s", 1000}, {"ms", 1}} {
		if n := ms / u.ms; n > 0 {
			fmt.Fprintf(&b, "%d%s", n, u.suffix)
			ms -= n * u.ms
		}
	}
	return b.String()
}

// describeRetention is a policy in a few words: "64KiB or 7d", "7d",
// "unlimited". Where none is known (an older lease service), "-".
func describeRetention(p *tenurev1.RetentionPolicy) string {
	if p == nil {
		return "-"
	}
	var parts []string
	if p.GetMaxBytes() > 0 {
		parts = append(parts, formatSize(p.GetMaxBytes()))
	}
	if p.GetMaxAgeMs() > 0 {
		parts = append(parts, formatAge(p.GetMaxAgeMs()))
	}
	if len(parts) == 0 {
		return "unlimited"
	}
	return strings.Join(parts, " or ")
}

// retentionJSON is a policy in tenurectl's JSON (the README's schema): the
// numbers as numbers, and the words the tables print.
type retentionJSON struct {
	MaxBytes uint64 `json:"max_bytes"`
	MaxAgeMs int64  `json:"max_age_ms"`
	Text     string `json:"text"`
}

func toRetentionJSON(p *tenurev1.RetentionPolicy) *retentionJSON {
	if p == nil {
		return nil
	}
	return &retentionJSON{MaxBytes: p.GetMaxBytes(), MaxAgeMs: p.GetMaxAgeMs(), Text: describeRetention(p)}
}

const rangeSetHelp = `
Change a range's retention policy in the lease service. Only the flags given
change; the other limit keeps its value. The range's leader picks the new
policy up within one retention interval (it reads its ranges' policies from
the lease service every --retention-interval); raising a limit stops further
deletion from then on, but what was already removed stays removed.

Example:
  tenurectl range set orders --retention-bytes 1GiB --retention-age 3d
  tenurectl range set orders --retention-age unlimited
`

func runRangeSet(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "range set", "RANGE [--retention-bytes SIZE] [--retention-age AGE]", rangeSetHelp+retentionFlagsHelp)
	o := addClusterFlags(e, fs)
	ret := addRetentionFlags(fs, "keep at most `SIZE` bytes of the newest records (64KiB, 1GiB, ...; 0 or unlimited: no limit); unchanged when not given",
		"remove records older than `AGE` (7d, 12h, ...; 0 or unlimited: no limit); unchanged when not given")
	positional, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(positional) != 1 {
		return usagef("want exactly one RANGE, got %d arguments", len(positional))
	}
	if !ret.any() {
		return usagef("nothing to change: give --retention-bytes, --retention-age or both")
	}
	id := positional[0]
	c := newClients(o)
	defer c.close()
	// Read, change the fields given, write: the policy is replaced whole.
	cur, err := c.getRange(ctx, id)
	if err != nil {
		return err
	}
	want := ret.apply(wire.RetentionOrDefault(cur.GetRetention()))
	cctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	resp, err := c.lease.SetRetention(cctx, connect.NewRequest(&tenurev1.SetRetentionRequest{RangeId: id, Retention: want}))
	switch connect.CodeOf(err) {
	case connect.CodeNotFound:
		return fmt.Errorf("range %q does not exist; 'tenurectl range list' lists ranges", id)
	case connect.CodeInvalidArgument:
		return fmt.Errorf("the lease service refused the policy: %s", connectMessage(err))
	case connect.CodeUnimplemented:
		return errors.New("the lease service does not know SetRetention: it is older than this tenurectl; upgrade it first")
	}
	if err != nil {
		return c.leaseErr(err)
	}
	r := resp.Msg.GetRange()
	if *o.json {
		return writeProtoJSON(e.stdout, r)
	}
	fmt.Fprintf(e.stdout, "range %s: retention %s (was %s); its leader applies it within one retention interval\n",
		id, describeRetention(r.GetRetention()), describeRetention(wire.RetentionOrDefault(cur.GetRetention())))
	return nil
}

const rangeShowHelp = `
Show one range as the lease service stores it: epoch, lease, replica set,
preferred leader, generation, membership revision, the membership change in
flight if any, and its retention policy.
`

func runRangeShow(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "range show", "RANGE", rangeShowHelp)
	o := addClusterFlags(e, fs)
	positional, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(positional) != 1 {
		return usagef("want exactly one RANGE, got %d arguments", len(positional))
	}
	c := newClients(o)
	defer c.close()
	r, err := c.getRange(ctx, positional[0])
	if err != nil {
		return err
	}
	if *o.json {
		return writeProtoJSON(e.stdout, r)
	}
	return writeRangeShow(e.stdout, r)
}

func writeRangeShow(w io.Writer, r *tenurev1.RangeInfo) error {
	tw := table.New(w, 2)
	fmt.Fprintf(tw, "range\t%s\n", r.GetRangeId())
	fmt.Fprintf(tw, "epoch\t%d\n", r.GetEpoch())
	fmt.Fprintf(tw, "lease\t%s, holder %s\n", leaseState(r.GetLease()), orDash(r.GetLease().GetHolderId()))
	fmt.Fprintf(tw, "replicas\t%s\n", describeReplicas(r.GetReplicas()))
	fmt.Fprintf(tw, "preferred\t%s\n", orDash(r.GetPreferredReplicaId()))
	fmt.Fprintf(tw, "generation\t%d\n", r.GetGeneration())
	fmt.Fprintf(tw, "membership revision\t%d\n", r.GetMembershipRevision())
	if ch := r.GetChange(); ch != nil {
		fmt.Fprintf(tw, "change in flight\t%s %s since epoch %d\n", membershipStepName(ch.GetStep()), ch.GetReplicaId(), ch.GetEpoch())
	}
	p := r.GetRetention()
	fmt.Fprintf(tw, "retention\t%s\n", describeRetention(p))
	if p != nil {
		fmt.Fprintf(tw, "  max bytes\t%s\n", formatSize(p.GetMaxBytes()))
		fmt.Fprintf(tw, "  max age\t%s\n", formatAge(p.GetMaxAgeMs()))
	}
	return tw.Flush()
}
