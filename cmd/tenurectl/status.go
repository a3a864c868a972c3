package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/internal/table"
	"github.com/tenurelog/tenure/pkg/journal"
	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

const statusHelp = `
Show every range (or one): its epoch and leader as the lease service has
them, and for each member replica what it says itself: role, the epoch it
acts under, log end, high-water mark, and how far it lags the leader (from
the leader's view of its fetches). A replica that does not answer is shown
as unreachable. A replica that stopped serving the range (a safety
violation, or a failure of its own store) is noted HALTED, with the reason;
it serves the range again only after a restart. A follower its leader has
waited 3 seconds or more for (no fetch of it held or answered since) is
noted "not fetching": it cannot reach the leader, or is stuck. Idle, its
lag stays 0, so nothing else shows it. When too few followers fetch for a
quorum, the leader's row says COMMITS STALLED (--json: commits_stalled): it
commits nothing although it still renews its lease, and no promotion
follows on its own. A follower whose disk is full fetches but stores
nothing, so it does not count. A replica
that cut records at fetch time since it started (its leader's history said
they were another leadership's, such as a deposed leader's uncommitted
tail) says how many, and where the last cut was: "cut 3 records at fetch
(1 time); last 7->4 at epoch 2, following r2, 5s ago". --json has the same
as fetch_truncations, fetch_truncated_records and last_fetch_truncation.

PID and UP are each replica's process id and how long ago it started
(GetStatus's pid and started_unix_ms; --json: pid, started_unix_ms), so a
replica restarted since the last look is told apart by its new pid.

A replica is dialled at the address it advertises. When that address's
host does not resolve from where tenurectl runs (a compose stack's
replica-1, seen from the host), the row says so and a hint below the
table says where to run tenurectl instead ('make ctl ARGS=status'). Where
other members' names do resolve (tenurectl on the stack's network), a
name that does not is a replica whose container stopped: the row says
that instead, with no hint.

A learner (a member being added: it fetches, never counts) has "(learner)"
after its role. A member whose replica answers with another incarnation
than the one recorded for it (its disk was replaced or wiped; the replica
reports the range among its lost ranges) is shown as "lost" with
INCARNATION MISMATCH: it does not serve the range until rebuilt ('tenurectl
range rebuild RANGE --replica ID': removed, then added back as a learner). A membership change in flight is named below the table.

Below the table, each range's retention: its policy as the lease service
stores it, and on its leader the log start, the stored bytes from there to
the log end, and the policy the leader applies (it differs from the stored
one for up to one retention interval after 'tenurectl range set'). --json
has log_start and stored_bytes for every replica, retention for the range
and retention_in_force for the leader.

Below the table, the elected promoter's view of every range it is not
content with: promoting; failing and retrying (how many attempts failed,
when the next one is, and why the last failed); no-quorum, waiting
without promoting while too many replicas refuse connections for a
quorum; or not-serving: its leader leads but calls its lease not valid
and refuses appends and reads, and the promoter binds the lease to it
again and, if that does not help, promotes. Nothing is printed there
when every range is healthy; a
promoter that cannot be reached, or is not the elected one, is said so.

The last line says how many ranges have a problem: no serving leader,
commits stalled, a member unreachable, lost, halted, quarantined, not
fetching or with its disk full, a promotion not healthy, or a membership
change in flight. With --problems only those ranges are shown (or "all N
ranges healthy"). --json names each range's problems in "problems" ([]
when healthy), and --problems filters it too.
`

// rangeStatus is one range as status reports it.
type rangeStatus struct {
	info    *tenurev1.RangeInfo
	members []memberStatus
	// promotion is the elected promoter's state of the range; nil when
	// the promoter was not asked, not reachable, not elected, or does not
	// track the range.
	promotion *tenurev1.RangePromotionState
	// problems is problemsOf the range.
	problems []string
}

// promoterView is what the promoter at --promoter said about itself.
type promoterView struct {
	id, leaderID string
	elected      bool
	// electionErr is why the promoter's election cannot run (etcd
	// unreachable), as it says; "" while it runs.
	electionErr string
	err         error // the promoter could not be asked
}

// notElected says why a promoter that answered has no promotion state.
func (v promoterView) notElected() string {
	if v.electionErr != "" {
		// Not a healthy standby: nobody may be elected while this lasts.
		return fmt.Sprintf("promoter %s is not elected (elected: %s): %s; failovers need an elected promoter", v.id, orDash(v.leaderID), v.electionErr)
	}
	return fmt.Sprintf("promoter %s is a standby (elected: %s); ask the elected one for promotion state", v.id, orDash(v.leaderID))
}

// promotions asks the promoter for its view, bounded by rpcTimeout. A failure
// is reported in the view, not returned: status shows the replicas anyway.
func (c *clients) promotions(ctx context.Context) (promoterView, map[string]*tenurev1.RangePromotionState) {
	cctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	resp, err := c.promoter.GetStatus(cctx, connect.NewRequest(&tenurev1.PromoterServiceGetStatusRequest{}))
	if err != nil {
		return promoterView{err: c.promoterErr(err)}, nil
	}
	m := resp.Msg
	v := promoterView{id: m.GetPromoterId(), leaderID: m.GetLeaderPromoterId(), elected: m.GetElected(), electionErr: m.GetElectionError()}
	if !v.elected {
		// A standby's range states are stale: not shown.
		return v, nil
	}
	states := make(map[string]*tenurev1.RangePromotionState, len(m.GetRanges()))
	for _, st := range m.GetRanges() {
		states[st.GetRangeId()] = st
	}
	return v, states
}

func runStatus(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "status", "[RANGE] [--problems]", statusHelp)
	o := addClusterFlags(e, fs)
	onlyProblems := fs.Bool("problems", false, "show only the ranges with a problem (see below); with none, say that all are healthy")
	positional, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(positional) > 1 {
		return usagef("want at most one RANGE, got %d arguments", len(positional))
	}
	c := newClients(o)
	defer c.close()
	var ranges []*tenurev1.RangeInfo
	if len(positional) == 1 {
		r, err := c.getRange(ctx, positional[0])
		if err != nil {
			return err
		}
		ranges = []*tenurev1.RangeInfo{r}
	} else if ranges, err = c.listRanges(ctx); err != nil {
		return err
	}
	out := make([]rangeStatus, len(ranges))
	if len(positional) == 1 {
		out[0] = rangeStatus{info: ranges[0], members: c.memberStatuses(ctx, ranges[0])}
	} else {
		// Every range: each replica is asked once for all it hosts.
		replicas := c.allReplicaStatuses(ctx, ranges)
		for i, r := range ranges {
			out[i] = rangeStatus{info: r, members: replicas.members(r)}
		}
	}
	view, states := c.promotions(ctx)
	unhealthy := 0
	for i := range out {
		out[i].promotion = states[out[i].info.GetRangeId()]
		out[i].problems = problemsOf(out[i])
		if len(out[i].problems) > 0 {
			unhealthy++
		}
	}
	all := len(out)
	if *onlyProblems {
		out = slices.DeleteFunc(out, func(r rangeStatus) bool { return len(r.problems) == 0 })
	}
	if *o.json {
		return writeStatusJSON(e.stdout, out, view)
	}
	switch {
	case all == 0:
		fmt.Fprintln(e.stdout, "no ranges; 'tenurectl range create' makes one")
		return nil
	case len(out) == 0:
		// Only with --problems. The promoter's own trouble (unreachable,
		// not elected) is still said: it is no range's.
		fmt.Fprintf(e.stdout, "%s\n", describeProblems(all, 0))
		return writePromotions(e.stdout, view, out)
	}
	if err := writeStatusTable(e.stdout, out); err != nil {
		return err
	}
	if err := writePromotions(e.stdout, view, out); err != nil {
		return err
	}
	if all > 1 {
		fmt.Fprintf(e.stdout, "\n%s\n", describeProblems(all, unhealthy))
	}
	return nil
}

// servingLeader is the member serving as the range's leader (leaderOf) and
// its id, or nil and "".
func servingLeader(members []memberStatus) (*memberStatus, string) {
	l, ok := leaderOf(members)
	if !ok {
		return nil, ""
	}
	return &l, l.replica.GetId()
}

// describeProblems is status's last line: how many of the ranges have a
// problem. With hundreds of ranges the table is thousands of lines, and
// this line (or --problems) is what tells whether to read it.
func describeProblems(all, unhealthy int) string {
	if unhealthy == 0 {
		return fmt.Sprintf("all %d ranges healthy", all)
	}
	return fmt.Sprintf("%d of %d ranges with a problem ('tenurectl status --problems' shows only those, each problem named in --json's problems)", unhealthy, all)
}

// problemsOf names what is wrong with range r, one short phrase each, or
// nil when nothing is: what an operator of many ranges filters on
// (--problems) and alerts on (--json's problems). Each is also said, at
// more length, in the table or below it.
func problemsOf(r rangeStatus) []string {
	var ps []string
	leader, leaderID := servingLeader(r.members)
	if leader == nil {
		ps = append(ps, "no serving leader")
	}
	if commitsStalled(r.members, leader, leaderID) != "" {
		ps = append(ps, "commits stalled")
	}
	for _, m := range r.members {
		id := m.replica.GetId()
		switch st := m.status; {
		case m.mismatch():
			ps = append(ps, id+" lost (incarnation mismatch): rebuild it")
		case st == nil && m.answeredAs != "" && m.answeredAs != id:
			ps = append(ps, id+" misdirected: another replica answers at its address")
		case st == nil && m.answeredAs != "":
			ps = append(ps, id+" does not host the range")
		case st == nil:
			ps = append(ps, id+" unreachable")
		case strings.Contains(st.GetHalted(), "quarantined"):
			ps = append(ps, id+" quarantined: rebuild it")
		case st.GetHalted() != "":
			ps = append(ps, id+" halted")
		case notFetching(m, leader, leaderID) != "":
			ps = append(ps, id+" not fetching")
		}
		if m.disk.GetFull() {
			ps = append(ps, id+" disk full")
		}
	}
	if st := r.promotion.GetState(); st != "" && st != "healthy" {
		ps = append(ps, "promoter: "+st)
	}
	if r.info.GetChange() != nil {
		ps = append(ps, "membership change in flight")
	}
	return ps
}

// writePromotions prints, below the status table, the promoter's view of
// the ranges it is not content with, or why there is no view.
func writePromotions(w io.Writer, v promoterView, rs []rangeStatus) error {
	switch {
	case v.err != nil:
		_, err := fmt.Fprintf(w, "\npromoter: %v\nno promotion state; failovers need an elected promoter\n", v.err)
		return err
	case !v.elected:
		_, err := fmt.Fprintf(w, "\n%s\n", v.notElected())
		return err
	}
	var unhappy []rangeStatus
	for _, r := range rs {
		if st := r.promotion.GetState(); st != "" && st != "healthy" {
			unhappy = append(unhappy, r)
		}
	}
	if len(unhappy) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\npromoter %s:\n", v.id)
	tw := table.New(w, 2)
	fmt.Fprintf(tw, "RANGE\tSTATE\tFAILED ATTEMPTS\tNEXT RETRY\tLAST ERROR\n")
	for _, r := range unhappy {
		p := r.promotion
		next := "-"
		if ms := p.GetNextRetryUnixMs(); ms > 0 {
			next = "in " + time.Until(time.UnixMilli(ms)).Round(100*time.Millisecond).String()
		}
		last := p.GetLastError()
		if p.GetState() == "not-serving" && last == "" {
			last = fmt.Sprintf("WARNING: leader %s refuses appends and reads (lease not valid); rebind, then promotion, follows", orDash(p.GetLeaderId()))
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", r.info.GetRangeId(), p.GetState(), p.GetAttempts(), next, orDash(last))
	}
	return tw.Flush()
}

// lagOf is how far member s lags the leader: the leader's own count of the
// follower's checked fetch offset when it has one, else the difference of
// log ends. ok is false when unknown.
func lagOf(s memberStatus, leader *memberStatus) (uint64, bool) {
	if leader == nil || s.status == nil {
		return 0, false
	}
	if f := progressOf(s, leader); f != nil {
		return f.GetLag(), true
	}
	if end := leader.status.GetLogEnd(); end >= s.status.GetLogEnd() {
		return end - s.status.GetLogEnd(), true
	}
	return 0, false
}

// progressOf is the leader's record of follower s, or nil.
func progressOf(s memberStatus, leader *memberStatus) *tenurev1.FollowerProgress {
	if leader == nil || leader.status == nil {
		return nil
	}
	for _, f := range leader.status.GetFollowers() {
		if f.GetReplicaId() == s.replica.GetId() {
			return f
		}
	}
	return nil
}

// notFetchingAfter is how long a leader may wait for a follower's next
// fetch before status says the follower is not fetching. A follower
// fetches again as soon as it has written an answer (milliseconds), so
// seconds mean it cannot reach the leader: its lag alone does not say
// that while the range is idle, and a range whose followers all stopped
// commits nothing although its leader looks healthy.
const notFetchingAfter = 3 * time.Second

// notFetching is the note for follower m when its leader has waited at
// least notFetchingAfter for its next fetch, else "".
func notFetching(m memberStatus, leader *memberStatus, leaderID string) string {
	f := progressOf(m, leader)
	if f == nil || m.replica.GetId() == leaderID {
		return ""
	}
	if fetchingNow(f) {
		return ""
	}
	d := time.Duration(f.GetFetchWaitingMs()) * time.Millisecond
	return fmt.Sprintf("not fetching: %s has waited %s for its next fetch", leaderID, d.Round(100*time.Millisecond))
}

// fetchingNow reports whether the leader waited less than notFetchingAfter
// for the follower's next fetch.
func fetchingNow(f *tenurev1.FollowerProgress) bool {
	return time.Duration(f.GetFetchWaitingMs())*time.Millisecond < notFetchingAfter
}

// commitsStalled is the leader row's note when too few followers fetch and
// can store for the leader to commit anything (it counts itself toward the
// quorum), else "". The lease says nothing of it: the leader still renews
// its lease. A follower whose disk is full goes on fetching (backing off)
// but stores nothing, so it acknowledges nothing either: counted as
// fetching, every follower's disk full read as a healthy leader while no
// append committed.
func commitsStalled(members []memberStatus, leader *memberStatus, leaderID string) string {
	if leader == nil || len(leader.status.GetFollowers()) == 0 {
		return "" // no progress reported: nothing to judge by
	}
	// Learners never count toward the commit.
	fetching, full, voters := 0, 0, 0
	for _, m := range members {
		if m.replica.GetLearner() {
			continue
		}
		voters++
		if f := progressOf(m, leader); f != nil && m.replica.GetId() != leaderID && fetchingNow(f) {
			if m.disk.GetFull() {
				full++
				continue
			}
			fetching++
		}
	}
	need := wire.Quorum(voters) - 1
	if fetching >= need {
		return ""
	}
	if full > 0 {
		return fmt.Sprintf("COMMITS STALLED: %d of %d followers fetching and storing, %d needed (%d more fetch, their disks full)", fetching, voters-1, need, full)
	}
	return fmt.Sprintf("COMMITS STALLED: %d of %d followers fetching, %d needed", fetching, voters-1, need)
}

func writeStatusTable(w io.Writer, rs []rangeStatus) error {
	tw := table.New(w, 2)
	fmt.Fprintf(tw, "RANGE\tEPOCH\tLEADER\tREPLICA\tROLE\tEPOCH\tLOG END\tHWM\tLAG\tPID\tUP\tNOTE\n")
	now := time.Now()
	namesResolve := someNameResolves(rs)
	for _, r := range rs {
		leader, leaderID := servingLeader(r.members)
		if leader == nil {
			leaderID = "none"
		}
		for i, m := range r.members {
			first := [3]string{"", "", ""}
			if i == 0 {
				first = [3]string{r.info.GetRangeId(), strconv.FormatUint(r.info.GetEpoch(), 10), leaderID}
			}
			if m.status == nil {
				note := shortErr(m.err)
				if host := unresolvedHost(m.err); host != "" {
					note = "host " + host + " does not resolve here (hint below)"
					if namesResolve {
						// Other members' names resolve: this is their
						// network, and a name that does not is a
						// replica gone (docker's DNS drops a stopped
						// container's name).
						note = "host " + host + " does not resolve, while other members' names do: its container stopped or removed?"
					}
				}
				if nf := notFetching(m, leader, leaderID); nf != "" {
					note += "; " + nf
				}
				role := "unreachable"
				if m.mismatch() {
					role = "lost"
					note = m.err.Error()
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t-\t-\t-\t-\t-\t-\t%s\n", first[0], first[1], first[2], m.replica.GetId(), role, note)
				continue
			}
			st := m.status
			epoch := strconv.FormatUint(st.GetEpoch(), 10)
			if st.GetFencedEpoch() != st.GetEpoch() {
				epoch += fmt.Sprintf(" (fenced %d)", st.GetFencedEpoch())
			}
			lag, note := "-", ""
			if n, ok := lagOf(m, leader); ok && m.replica.GetId() != leaderID {
				lag = strconv.FormatUint(n, 10)
			}
			if st.GetRole() == tenurev1.Role_ROLE_LEADER && !st.GetLeaseValid() {
				note = "lease not valid: not serving"
			}
			if nf := notFetching(m, leader, leaderID); nf != "" {
				note = nf
			}
			if m.replica.GetId() == leaderID {
				note = "lease " + leaseState(r.info.GetLease())
				if h := r.info.GetLease().GetHolderId(); h != leaderID {
					note += ", held by " + orDash(h) + " (not yet handed to the leader)"
				}
				if st := commitsStalled(r.members, leader, leaderID); st != "" {
					note += "; " + st
				}
			}
			if cut := fetchCutsNote(st, time.Now()); cut != "" {
				note = joinNotes(note, cut)
			}
			// A halted replica serves nothing for the range until restarted
			// (or, for a quarantined copy, rebuilt): that, and why,
			// matters more than anything else to say.
			if h := st.GetHalted(); h != "" {
				note = "HALTED: " + shortText(h)
				if strings.Contains(h, "quarantined") {
					note = fmt.Sprintf("HALTED (quarantined; tenurectl range rebuild %s --replica %s): %s", r.info.GetRangeId(), m.replica.GetId(), shortText(h))
				}
			}
			role := shownRole(st)
			if m.replica.GetLearner() {
				role += " (learner)"
			}
			pid, up := processOf(m, now)
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", first[0], first[1], first[2], m.replica.GetId(), role, epoch, st.GetLogEnd(), st.GetHighWaterMark(), lag, pid, up, note)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if !namesResolve {
		// Where other members' names resolve (the stack's network), the
		// rows already say which replica is gone; "run tenurectl there"
		// would send the operator where they are.
		writeUnresolvedHint(w, rs)
	}
	writeDiskFullLines(w, rs)
	writeRetentionLines(w, rs)
	// A change in flight matters until it completes: promotions need a
	// quorum of the old and of the new voters meanwhile.
	for _, r := range rs {
		if ch := r.info.GetChange(); ch != nil {
			var old []string
			for _, o := range ch.GetOldReplicas() {
				if !o.GetLearner() {
					old = append(old, o.GetId())
				}
			}
			fmt.Fprintf(w, "\nrange %s: membership change in flight: %s %s since epoch %d, started %s; promotions need a quorum of the voters before it (%s) and after it\n",
				r.info.GetRangeId(), membershipStepName(ch.GetStep()), ch.GetReplicaId(), ch.GetEpoch(),
				time.UnixMilli(ch.GetStartedUnixMs()).UTC().Format("15:04:05"), strings.Join(old, ", "))
		}
	}
	return nil
}

// writeDiskFullLines says, once per replica, that its disk is full: it
// refuses appends (a leader answers ResourceExhausted, a follower lags)
// until space is back, which matters more than any one range's line.
func writeDiskFullLines(w io.Writer, rs []rangeStatus) {
	seen := map[string]bool{}
	for _, r := range rs {
		for _, m := range r.members {
			id := m.replica.GetId()
			if d := m.disk; d.GetFull() && !seen[id] {
				seen[id] = true
				since := ""
				if ms := d.GetFullSinceUnixMs(); ms > 0 {
					since = " since " + time.UnixMilli(ms).UTC().Format("15:04:05")
				}
				fmt.Fprintf(w, "\nreplica %s: DISK FULL%s: %s (free %s, reserve %s, its files use %s); it refuses appends until space is back: free space on its filesystem, or lower the ranges' retention\n",
					id, since, shortText(d.GetReason()), formatBytes(d.GetFreeBytes()), formatBytes(d.GetReserveBytes()), formatBytes(d.GetUsedBytes()))
			}
		}
	}
}

// processOf is the PID and UP cells of a member that answered: its
// process id and how long ago it started, "-" for what it did not say.
func processOf(m memberStatus, now time.Time) (pid, up string) {
	pid, up = "-", "-"
	if m.pid > 0 {
		pid = strconv.FormatInt(m.pid, 10)
	}
	if m.startedUnixMs > 0 {
		up = uptime(now.Sub(time.UnixMilli(m.startedUnixMs)))
	}
	return pid, up
}

// uptime is d in its two largest units: "42s", "3m12s", "5h3m", "2d4h".
func uptime(d time.Duration) string {
	d = max(d, 0).Round(time.Second)
	switch {
	case d < time.Hour:
		return d.String()
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
}

// writeUnresolvedHint explains, below the table, members whose address's
// host does not resolve from where tenurectl runs. Replicas advertise the
// address their peers use (in compose, a host name on the stack's private
// network, such as replica-1), and tenurectl dials what they advertise:
// from outside that network every such member reads "unreachable" while
// it is healthy.
func writeUnresolvedHint(w io.Writer, rs []rangeStatus) {
	var hosts []string
	for _, r := range rs {
		for _, m := range r.members {
			if h := unresolvedHost(m.err); h != "" && !slices.Contains(hosts, h) {
				hosts = append(hosts, h)
			}
		}
	}
	if len(hosts) == 0 {
		return
	}
	which := "host " + hosts[0] + " does"
	if len(hosts) > 1 {
		which = "hosts " + strings.Join(hosts, ", ") + " do"
	}
	fmt.Fprintf(w, "\nhint: %s not resolve from here. Replicas are dialled at the addresses they advertise;"+
		" a compose stack's (replica-1, ...) resolve only on its network: run tenurectl there ('make ctl ARGS=status'),"+
		" or have the replicas advertise addresses this host reaches (tenure replica --advertise)\n", which)
}

// someNameResolves says whether some member's address is a host name (not
// an IP address) that resolved here: its replica answered, or failed in
// another way than the name's lookup.
func someNameResolves(rs []rangeStatus) bool {
	for _, r := range rs {
		for _, m := range r.members {
			u, err := url.Parse(m.replica.GetAddress())
			if err != nil || u.Hostname() == "" || net.ParseIP(u.Hostname()) != nil {
				continue
			}
			if m.status != nil || (m.err != nil && unresolvedHost(m.err) == "") {
				return true
			}
		}
	}
	return false
}

// unresolvedHost is the host name err failed to resolve, or "".
func unresolvedHost(err error) string {
	var dns *net.DNSError
	if err == nil || !errors.As(err, &dns) {
		return ""
	}
	return dns.Name
}

// membershipStepName is a step's short name, e.g. "add-learner".
func membershipStepName(s tenurev1.MembershipStep) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(s.String(), "MEMBERSHIP_STEP_")), "_", "-")
}

// fetchCutsNote says how much the replica cut at fetch time, and where its
// last cut was, or "" when it cut nothing since it started.
func fetchCutsNote(st *tenurev1.RangeStatus, now time.Time) string {
	n := st.GetFetchTruncations()
	if n == 0 {
		return ""
	}
	ago := now.Sub(time.UnixMilli(st.GetLastFetchTruncationUnixMs())).Round(time.Second)
	return fmt.Sprintf("cut %s at fetch (%s); last %d->%d at epoch %d, following %s, %s ago",
		plural(int(st.GetFetchTruncatedRecords()), "record"), plural(int(n), "time"),
		st.GetLastFetchTruncationFrom(), st.GetLastFetchTruncationTo(), st.GetLastFetchTruncationEpoch(),
		orDash(st.GetLastFetchTruncationLeader()), max(ago, 0))
}

// joinNotes joins two notes of one row.
func joinNotes(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

type statusJSON struct {
	Range     string              `json:"range_id"`
	Epoch     uint64              `json:"epoch"`
	Leader    string              `json:"leader_id"`
	Lease     leaseJSON           `json:"lease"`
	Replicas  []replicaStatusJSON `json:"replicas"`
	Promotion *promotionJSON      `json:"promotion,omitempty"`
	// Change is the membership change in flight, e.g. "add-learner r4
	// since epoch 7".
	Change string `json:"membership_change,omitempty"`
	// CommitsStalled is the leader row's COMMITS STALLED note: too few
	// followers fetch (and can store) for the leader to commit anything.
	CommitsStalled string `json:"commits_stalled,omitempty"`
	// Retention is the range's policy as the lease service stores it.
	Retention *retentionJSON `json:"retention,omitempty"`
	// Problems names what is wrong with the range (problemsOf); empty
	// when it is healthy.
	Problems []string `json:"problems"`
}

// promotionJSON is the elected promoter's state of a range. When there is
// none to show, state is "unknown" and promoter_error says why (the
// promoter could not be asked, or is a standby): what the table prints
// below itself.
type promotionJSON struct {
	State           string `json:"state"`
	Attempts        uint32 `json:"attempts"`
	LastError       string `json:"last_error,omitempty"`
	NextRetryUnixMs int64  `json:"next_retry_unix_ms,omitempty"`
	PromoterError   string `json:"promoter_error,omitempty"`
}

// noPromotionState is the promotion of every range when the promoter's
// view has none: why, or nil when the elected promoter answered.
func noPromotionState(v promoterView) *promotionJSON {
	switch {
	case v.err != nil:
		return &promotionJSON{State: "unknown", PromoterError: v.err.Error() + "; no promotion state; failovers need an elected promoter"}
	case !v.elected:
		return &promotionJSON{State: "unknown", PromoterError: v.notElected()}
	}
	return nil
}

type leaseJSON struct {
	Holder         string `json:"holder_id"`
	Epoch          uint64 `json:"epoch"`
	Live           bool   `json:"live"`
	TTLRemainingMs int64  `json:"ttl_remaining_ms"`
}

type replicaStatusJSON struct {
	ID            string  `json:"id"`
	Address       string  `json:"address"`
	Reachable     bool    `json:"reachable"`
	Error         string  `json:"error,omitempty"`
	Role          string  `json:"role,omitempty"`
	Epoch         uint64  `json:"epoch"`
	FencedEpoch   uint64  `json:"fenced_epoch"`
	LogStart      uint64  `json:"log_start"`
	LogEnd        uint64  `json:"log_end"`
	HighWaterMark uint64  `json:"high_water_mark"`
	LeaseValid    bool    `json:"lease_valid"`
	Lag           *uint64 `json:"lag"`
	// FetchWaitingMs is how long the leader has waited for this
	// follower's next fetch (FollowerProgress.fetch_waiting_ms); only for
	// followers the leader reports.
	FetchWaitingMs *uint64 `json:"fetch_waiting_ms,omitempty"`
	Halted         string  `json:"halted,omitempty"`
	Learner        bool    `json:"learner"`
	// Incarnation is the member's recorded one; Answered the replica's own.
	Incarnation string `json:"incarnation,omitempty"`
	Answered    string `json:"answered_incarnation,omitempty"`
	// IncarnationMismatch: the replica answering is not the member's disk.
	IncarnationMismatch bool `json:"incarnation_mismatch"`
	// PID and StartedUnixMs name the replica's process, when it answered.
	PID           int64 `json:"pid,omitempty"`
	StartedUnixMs int64 `json:"started_unix_ms,omitempty"`
	// The replica's disk (GetStatus's disk), when it answered: DiskFull
	// while it refuses appends for want of space (below its
	// --disk-reserve, or a write failed), with the filesystem's free
	// bytes, the reserve and what the store's files take.
	DiskFull         bool   `json:"disk_full"`
	DiskFullReason   string `json:"disk_full_reason,omitempty"`
	DiskFreeBytes    uint64 `json:"disk_free_bytes"`
	DiskReserveBytes uint64 `json:"disk_reserve_bytes"`
	DiskUsedBytes    uint64 `json:"disk_used_bytes"`
	// The truncations the replica made at fetch time since it started
	// (RangeStatus.fetch_truncations and the fields after it).
	FetchTruncations      uint64               `json:"fetch_truncations"`
	FetchTruncatedRecords uint64               `json:"fetch_truncated_records"`
	LastFetchTruncation   *fetchTruncationJSON `json:"last_fetch_truncation,omitempty"`
	// StoredBytes is the bytes of the replica's batches from its log start
	// to its log end (RangeStatus).
	StoredBytes uint64 `json:"stored_bytes"`
	// RetentionInForce is the policy a leader applies (absent on
	// followers, and on a leader that has not learned one yet).
	RetentionInForce *retentionJSON `json:"retention_in_force,omitempty"`
}

// fetchTruncationJSON is a replica's last truncation at fetch time: the
// log end it cut from, the offset it cut to, the epoch it fetched at, the
// leader it followed, and when.
type fetchTruncationJSON struct {
	From   uint64 `json:"from"`
	To     uint64 `json:"to"`
	Epoch  uint64 `json:"epoch"`
	Leader string `json:"leader_id"`
	UnixMs int64  `json:"unix_ms"`
}

func writeStatusJSON(w io.Writer, rs []rangeStatus, view promoterView) error {
	out := []statusJSON{}
	for _, r := range rs {
		leader, leaderID := servingLeader(r.members)
		sj := statusJSON{Range: r.info.GetRangeId(), Epoch: r.info.GetEpoch(), Replicas: []replicaStatusJSON{},
			Lease: leaseJSON{Holder: r.info.GetLease().GetHolderId(), Epoch: r.info.GetLease().GetEpoch(), Live: r.info.GetLease().GetLive(), TTLRemainingMs: r.info.GetLease().GetTtlRemainingMs()}}
		if leader != nil {
			sj.Leader = leaderID
			sj.CommitsStalled = commitsStalled(r.members, leader, sj.Leader)
		}
		for _, m := range r.members {
			rj := replicaStatusJSON{ID: m.replica.GetId(), Address: m.replica.GetAddress(), Learner: m.replica.GetLearner(),
				Incarnation: m.replica.GetIncarnation(), Answered: m.incarnation, IncarnationMismatch: m.mismatch(),
				PID: m.pid, StartedUnixMs: m.startedUnixMs}
			if d := m.disk; d != nil {
				rj.DiskFull, rj.DiskFullReason = d.GetFull(), d.GetReason()
				rj.DiskFreeBytes, rj.DiskReserveBytes, rj.DiskUsedBytes = d.GetFreeBytes(), d.GetReserveBytes(), d.GetUsedBytes()
			}
			if m.status == nil {
				rj.Error = m.err.Error()
			} else {
				st := m.status
				rj.Reachable, rj.Role, rj.Epoch, rj.FencedEpoch = true, roleName(st.GetRole()), st.GetEpoch(), st.GetFencedEpoch()
				rj.LogStart, rj.LogEnd, rj.HighWaterMark, rj.LeaseValid = st.GetLogStart(), st.GetLogEnd(), st.GetHighWaterMark(), st.GetLeaseValid()
				rj.Halted = st.GetHalted()
				rj.StoredBytes, rj.RetentionInForce = st.GetStoredBytes(), toRetentionJSON(st.GetRetention())
				rj.FetchTruncations, rj.FetchTruncatedRecords = st.GetFetchTruncations(), st.GetFetchTruncatedRecords()
				if st.GetFetchTruncations() > 0 {
					rj.LastFetchTruncation = &fetchTruncationJSON{From: st.GetLastFetchTruncationFrom(), To: st.GetLastFetchTruncationTo(),
						Epoch: st.GetLastFetchTruncationEpoch(), Leader: st.GetLastFetchTruncationLeader(), UnixMs: st.GetLastFetchTruncationUnixMs()}
				}
				if n, ok := lagOf(m, leader); ok && m.replica.GetId() != sj.Leader {
					rj.Lag = &n
				}
			}
			if f := progressOf(m, leader); f != nil && m.replica.GetId() != sj.Leader {
				ms := f.GetFetchWaitingMs()
				rj.FetchWaitingMs = &ms
			}
			sj.Replicas = append(sj.Replicas, rj)
		}
		if ch := r.info.GetChange(); ch != nil {
			sj.Change = fmt.Sprintf("%s %s since epoch %d", membershipStepName(ch.GetStep()), ch.GetReplicaId(), ch.GetEpoch())
		}
		sj.Retention = toRetentionJSON(r.info.GetRetention())
		sj.Problems = append([]string{}, r.problems...) // [] rather than null when healthy
		if p := r.promotion; p != nil {
			sj.Promotion = &promotionJSON{State: p.GetState(), Attempts: p.GetAttempts(), LastError: p.GetLastError(), NextRetryUnixMs: p.GetNextRetryUnixMs()}
		} else {
			sj.Promotion = noPromotionState(view)
		}
		out = append(out, sj)
	}
	return writeJSON(w, out)
}

const epochsHelp = `
Print every replica's epoch history side by side: for each leadership epoch,
the offset of the replica's first record written under it. Then each
replica's divergence point against the leader's history: the offset below
which both hold records of the same leaderships. A replica whose log runs
past its divergence point holds another epoch's records there; it truncates
them when it next fetches from the leader (never below its own HWM).

Without a serving leader, divergence points are taken against the replica
with the most recent epoch.
`

// historyOf is one replica's epoch history as epochs reports it.
type historyOf struct {
	member  memberStatus
	history []journal.EpochStart
	logEnd  uint64
	hwm     uint64
	err     error
}

func runEpochs(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "epochs", "RANGE", epochsHelp)
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
	sts := c.memberStatuses(ctx, r)
	hs := make([]historyOf, len(sts))
	var wg sync.WaitGroup
	for i, m := range sts {
		hs[i].member = m
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, rpcTimeout)
			defer cancel()
			resp, err := c.replica(m.replica.GetAddress()).GetEpochHistory(cctx, connect.NewRequest(&tenurev1.GetEpochHistoryRequest{RangeId: r.GetRangeId()}))
			if err != nil {
				hs[i].err = err
				return
			}
			hs[i].logEnd, hs[i].hwm = resp.Msg.GetLogEnd(), resp.Msg.GetHighWaterMark()
			for _, es := range resp.Msg.GetHistory() {
				hs[i].history = append(hs[i].history, journal.EpochStart{Epoch: es.GetEpoch(), Start: es.GetStartOffset()})
			}
		})
	}
	wg.Wait()

	ref, serving := referenceOf(sts, hs)
	if *o.json {
		return writeEpochsJSON(e.stdout, r.GetRangeId(), hs, ref, serving)
	}
	return writeEpochsTable(e.stdout, r.GetRangeId(), hs, ref, serving)
}

// referenceOf picks the history divergence is measured against: the
// serving leader's, else the answering replica with the latest last epoch.
// -1 when no replica answered.
func referenceOf(sts []memberStatus, hs []historyOf) (int, bool) {
	if l, ok := leaderOf(sts); ok {
		for i := range hs {
			if hs[i].member.replica.GetId() == l.replica.GetId() && hs[i].err == nil {
				return i, true
			}
		}
	}
	best := -1
	for i, h := range hs {
		if h.err != nil || len(h.history) == 0 {
			continue
		}
		if best < 0 || h.history[len(h.history)-1].Epoch > hs[best].history[len(hs[best].history)-1].Epoch {
			best = i
		}
	}
	return best, false
}

func writeEpochsTable(w io.Writer, rangeID string, hs []historyOf, ref int, serving bool) error {
	var epochs []uint64
	for _, h := range hs {
		for _, es := range h.history {
			if !slices.Contains(epochs, es.Epoch) {
				epochs = append(epochs, es.Epoch)
			}
		}
	}
	slices.Sort(epochs)
	fmt.Fprintf(w, "range %s: where each replica's first record of each epoch sits\n\n", rangeID)
	tw := table.New(w, 3)
	fmt.Fprint(tw, "\t")
	for _, h := range hs {
		role := "unreachable"
		switch {
		case h.member.mismatch():
			// It answered, as another disk: status calls it lost.
			role = "lost"
		case h.member.status != nil:
			role = shownRole(h.member.status)
		}
		fmt.Fprintf(tw, "%s (%s)\t", h.member.replica.GetId(), role)
	}
	fmt.Fprintln(tw)
	for _, ep := range epochs {
		fmt.Fprintf(tw, "epoch %d\t", ep)
		for _, h := range hs {
			cell := "-"
			if h.err != nil {
				cell = "?"
			}
			for _, es := range h.history {
				if es.Epoch == ep {
					cell = strconv.FormatUint(es.Start, 10)
				}
			}
			fmt.Fprintf(tw, "%s\t", cell)
		}
		fmt.Fprintln(tw)
	}
	for _, row := range []struct {
		name string
		v    func(historyOf) uint64
	}{{"log end", func(h historyOf) uint64 { return h.logEnd }}, {"hwm", func(h historyOf) uint64 { return h.hwm }}} {
		fmt.Fprintf(tw, "%s\t", row.name)
		for _, h := range hs {
			if h.err != nil {
				fmt.Fprint(tw, "?\t")
			} else {
				fmt.Fprintf(tw, "%d\t", row.v(h))
			}
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	if ref < 0 {
		fmt.Fprintln(w, "no replica answered with a known history: no divergence points")
		return nil
	}
	refID := hs[ref].member.replica.GetId()
	if serving {
		fmt.Fprintf(w, "divergence against the leader %s:\n", refID)
	} else {
		fmt.Fprintf(w, "no serving leader; divergence against %s, the replica with the latest epoch:\n", refID)
	}
	for i, h := range hs {
		if i == ref {
			continue
		}
		fmt.Fprintf(w, "  %s: %s\n", h.member.replica.GetId(), divergenceText(hs[ref].history, h))
	}
	return nil
}

// shownRole is a replica's role in a table. A copy quarantined at startup
// acts in no role: it reported the role its damaged state held
// ("follower", with log end 0) or none ("unspecified", when the state
// itself failed its check). It shows as halted, as the metrics count it.
// A replica halted while acting keeps the role it had; its note says
// HALTED and why.
func shownRole(st *tenurev1.RangeStatus) string {
	if h := st.GetHalted(); h != "" && (st.GetRole() == tenurev1.Role_ROLE_UNSPECIFIED || strings.Contains(h, "quarantined")) {
		return "halted"
	}
	return roleName(st.GetRole())
}

// divergenceText says where h stops agreeing with the reference history.
func divergenceText(ref []journal.EpochStart, h historyOf) string {
	if h.member.mismatch() && h.member.err != nil {
		// Its disk lost the range: its own answer ("not hosted, no fence
		// has named it") would hide that a fence did, and was refused.
		return "lost: " + h.member.err.Error()
	}
	if h.err != nil {
		// Only a failed dial is "unreachable": a replica that answered
		// and refused (a quarantined copy) said why, and that is the point.
		if isDialError(h.err) {
			return "unreachable: no history to compare"
		}
		return "no history: " + shortErr(h.err)
	}
	p, ok := journal.DivergencePoint(ref, h.history)
	switch {
	case !ok && h.logEnd == 0:
		return "empty log: nothing to compare, it catches up by fetching"
	case !ok:
		return "history unknown: the fetch check alone reconciles it"
	case p == math.MaxUint64:
		return "identical history"
	case h.logEnd > p && h.hwm > p:
		// Its own HWM says records from p on were committed: a replica
		// never truncates below its HWM, so nothing is cut, and the two
		// logs disagree about committed records (the replica halts with a
		// safety violation when it fetches). Saying "cut when it fetches"
		// here hid acknowledged records that only this copy still holds.
		return fmt.Sprintf("diverges at offset %d, below its HWM %d: its records %d..%d were committed under another leadership and are NOT cut (a replica never truncates below its HWM); the two logs disagree about committed records: see 'tenurectl status' and 'tenurectl transitions'", p, h.hwm, p, min(h.hwm, h.logEnd)-1)
	case h.logEnd > p:
		return fmt.Sprintf("diverges at offset %d: its records %d..%d are another leadership's and are cut when it fetches", p, p, h.logEnd-1)
	}
	return fmt.Sprintf("diverges at offset %d, where its log ends: it only lacks later records", p)
}

type epochsJSON struct {
	Range string `json:"range_id"`
	// Reference is the replica divergence is measured against; Leader is
	// set when it is the serving leader.
	Reference string             `json:"reference_id"`
	Leader    string             `json:"leader_id"`
	Replicas  []replicaEpochJSON `json:"replicas"`
}

type replicaEpochJSON struct {
	ID            string      `json:"id"`
	Role          string      `json:"role,omitempty"`
	Error         string      `json:"error,omitempty"`
	History       []entryJSON `json:"history"`
	LogEnd        uint64      `json:"log_end"`
	HighWaterMark uint64      `json:"high_water_mark"`
	// DivergencePoint is null when there is none to compute (unknown
	// history, unreachable) and when identical.
	DivergencePoint *uint64 `json:"divergence_point"`
	// Identical: the history is the reference's, the reference itself
	// included (a script comparing every replica to the leader must not
	// find the leader differing from itself).
	Identical bool `json:"identical"`
}

func writeEpochsJSON(w io.Writer, rangeID string, hs []historyOf, ref int, serving bool) error {
	out := epochsJSON{Range: rangeID, Replicas: []replicaEpochJSON{}}
	if ref >= 0 {
		out.Reference = hs[ref].member.replica.GetId()
		if serving {
			out.Leader = out.Reference
		}
	}
	for i, h := range hs {
		rj := replicaEpochJSON{ID: h.member.replica.GetId(), History: []entryJSON{}, LogEnd: h.logEnd, HighWaterMark: h.hwm}
		if h.member.status != nil {
			rj.Role = roleName(h.member.status.GetRole())
		}
		if h.err != nil {
			rj.Error = h.err.Error()
		}
		if h.member.mismatch() && h.member.err != nil {
			// As in the table and in status: lost, and why.
			rj.Role, rj.Error = "lost", h.member.err.Error()
		}
		for j, es := range h.history {
			rj.History = append(rj.History, entryJSON{Index: j, Epoch: es.Epoch, Start: es.Start})
		}
		if i == ref {
			// The reference's history is what the others are measured
			// against: identical to itself, by definition. (It used to be
			// reported false, as if it diverged from itself.)
			rj.Identical = true
		} else if ref >= 0 && h.err == nil {
			if p, ok := journal.DivergencePoint(hs[ref].history, h.history); ok {
				if p == math.MaxUint64 {
					rj.Identical = true
				} else {
					rj.DivergencePoint = &p
				}
			}
		}
		out.Replicas = append(out.Replicas, rj)
	}
	return writeJSON(w, out)
}

// writeRetentionLines prints each range's retention below the status table:
// the policy stored, and what its leader holds and applies.
func writeRetentionLines(w io.Writer, rs []rangeStatus) {
	fmt.Fprintln(w)
	for _, r := range rs {
		line := fmt.Sprintf("range %s: retention %s", r.info.GetRangeId(), describeRetention(r.info.GetRetention()))
		if l, ok := leaderOf(r.members); ok && l.status != nil {
			st := l.status
			line += fmt.Sprintf("; leader %s holds %d..%d (%s stored)", l.replica.GetId(), st.GetLogStart(), st.GetLogEnd(), formatBytes(st.GetStoredBytes()))
			switch inForce := st.GetRetention(); {
			case inForce == nil:
				line += ", applies no policy yet (not learned)"
			case describeRetention(inForce) != describeRetention(r.info.GetRetention()):
				line += ", still applies " + describeRetention(inForce) + " (picks up the change within one retention interval)"
			}
		}
		fmt.Fprintln(w, line)
	}
}

// formatBytes is a byte count for people: "512B", "64.0KiB", "1.5GiB".
func formatBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(n)/float64(div), "KMGTP"[exp])
}
