package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// haltedRange is a range whose follower r2 stopped on a safety violation.
func haltedRange() []rangeStatus {
	return []rangeStatus{{
		info: &tenurev1.RangeInfo{RangeId: "orders", Epoch: 3},
		members: []memberStatus{
			{replica: &tenurev1.Replica{Id: "r1"}, status: &tenurev1.RangeStatus{RangeId: "orders", Role: tenurev1.Role_ROLE_LEADER, Epoch: 3, FencedEpoch: 3, LogEnd: 9, HighWaterMark: 9, LeaseValid: true}},
			{replica: &tenurev1.Replica{Id: "r2"}, status: &tenurev1.RangeStatus{RangeId: "orders", Role: tenurev1.Role_ROLE_FOLLOWER, Epoch: 3, FencedEpoch: 3, LogEnd: 7, HighWaterMark: 7,
				Halted: `range "orders": leader r1 at epoch 3 answers that our log diverges at 5 (its epoch 2 ends at 5), below our HWM 7: a committed record disagrees; not truncating, not fetching`}},
		},
	}}
}

func TestStatusShowsHaltedReplica(t *testing.T) {
	var out bytes.Buffer
	if err := writeStatusTable(&out, haltedRange()); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(out.String(), "\n")
	var r1, r2 string
	for _, l := range lines {
		switch {
		case strings.Contains(l, " r1  ") && strings.Contains(l, "leader "):
			r1 = l
		case strings.Contains(l, " r2  ") && strings.Contains(l, "follower "):
			r2 = l
		}
	}
	if !strings.Contains(r2, "HALTED: range \"orders\": leader r1") || len(r2) > 200 {
		t.Errorf("r2's row = %q, want a HALTED note with the start of the reason, cut to a cell", r2)
	}
	if strings.Contains(r1, "HALTED") {
		t.Errorf("r1's row = %q, want no HALTED note", r1)
	}

	out.Reset()
	if err := writeStatusJSON(&out, haltedRange(), promoterView{elected: true}); err != nil {
		t.Fatal(err)
	}
	var got []statusJSON
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("status JSON %q: %v", out.String(), err)
	}
	if h := got[0].Replicas[1].Halted; !strings.Contains(h, "below our HWM 7") {
		t.Errorf("r2 JSON halted = %q, want the whole reason", h)
	}
	if h := got[0].Replicas[0].Halted; h != "" || strings.Contains(out.String(), `"halted": ""`) {
		t.Errorf("r1 JSON halted = %q, want the field left out", h)
	}
}

func TestStatusShowsPromotionsNotHealthy(t *testing.T) {
	rs := haltedRange()
	rs = append(rs, rangeStatus{info: &tenurev1.RangeInfo{RangeId: "events", Epoch: 7}})
	rs[0].promotion = &tenurev1.RangePromotionState{RangeId: "orders", Epoch: 3, LeaderId: "r1", State: "healthy"}
	rs[1].promotion = &tenurev1.RangePromotionState{RangeId: "events", Epoch: 7, State: "unavailable", Attempts: 12,
		LastError:       "unavailable: range events: 2 of 3 replicas refuse connections (r1, r2) and a promotion needs 2 to answer; no epoch is granted until enough are back",
		NextRetryUnixMs: time.Now().Add(90 * time.Second).UnixMilli()}

	var out bytes.Buffer
	if err := writePromotions(&out, promoterView{id: "p1", elected: true}, rs); err != nil {
		t.Fatal(err)
	}
	got := normalize(out.String())
	if !strings.Contains(got, "promoter p1: RANGE STATE FAILED ATTEMPTS NEXT RETRY LAST ERROR events unavailable 12 in 1m") ||
		!strings.Contains(got, "refuse connections (r1, r2) and a promotion needs 2 to answer; no epoch is granted until enough are back") {
		t.Errorf("promotions = %q, want the unavailable range with its attempts, next retry and whole last error", out.String())
	}
	if strings.Contains(got, "orders") {
		t.Errorf("promotions = %q, want the healthy range left out", out.String())
	}

	// Every range healthy: nothing at all.
	out.Reset()
	if err := writePromotions(&out, promoterView{id: "p1", elected: true}, rs[:1]); err != nil || out.Len() != 0 {
		t.Errorf("promotions of healthy ranges = %q, %v; want nothing", out.String(), err)
	}
	// No view: said so, not silently.
	out.Reset()
	_ = writePromotions(&out, promoterView{id: "p2", leaderID: "p1"}, rs)
	if !strings.Contains(out.String(), "promoter p2 is a standby (elected: p1)") {
		t.Errorf("standby promoter = %q", out.String())
	}
	out.Reset()
	_ = writePromotions(&out, promoterView{err: errors.New("cannot reach the promoter at http://127.0.0.1:1")}, rs)
	if !strings.Contains(out.String(), "cannot reach the promoter") || !strings.Contains(out.String(), "failovers need an elected promoter") {
		t.Errorf("unreachable promoter = %q", out.String())
	}

	out.Reset()
	if err := writeStatusJSON(&out, rs, promoterView{elected: true}); err != nil {
		t.Fatal(err)
	}
	var js []statusJSON
	if err := json.Unmarshal(out.Bytes(), &js); err != nil {
		t.Fatal(err)
	}
	if p := js[1].Promotion; p == nil || p.State != "unavailable" || p.Attempts != 12 || !strings.Contains(p.LastError, "refuse connections") || p.NextRetryUnixMs == 0 {
		t.Errorf("events JSON promotion = %+v", p)
	}
	if p := js[0].Promotion; p == nil || p.State != "healthy" || p.LastError != "" {
		t.Errorf("orders JSON promotion = %+v", p)
	}
}

// A follower the leader has waited seconds for is said to be not fetching:
// idle, its lag is 0, and nothing else would show it.
func TestStatusShowsAFollowerNotFetching(t *testing.T) {
	rs := []rangeStatus{{
		info: &tenurev1.RangeInfo{RangeId: "orders", Epoch: 3},
		members: []memberStatus{
			{replica: &tenurev1.Replica{Id: "r1"}, status: &tenurev1.RangeStatus{RangeId: "orders", Role: tenurev1.Role_ROLE_LEADER, Epoch: 3, FencedEpoch: 3, LogEnd: 9, HighWaterMark: 9, LeaseValid: true,
				Followers: []*tenurev1.FollowerProgress{{ReplicaId: "r2", FetchOffset: 9, FetchWaitingMs: 6340}, {ReplicaId: "r3", FetchOffset: 9, FetchWaitingMs: 20}}}},
			{replica: &tenurev1.Replica{Id: "r2"}, status: &tenurev1.RangeStatus{RangeId: "orders", Role: tenurev1.Role_ROLE_FOLLOWER, Epoch: 3, FencedEpoch: 3, LogEnd: 9, HighWaterMark: 9}},
			{replica: &tenurev1.Replica{Id: "r3"}, status: &tenurev1.RangeStatus{RangeId: "orders", Role: tenurev1.Role_ROLE_FOLLOWER, Epoch: 3, FencedEpoch: 3, LogEnd: 9, HighWaterMark: 9}},
		},
	}}
	var out bytes.Buffer
	if err := writeStatusTable(&out, rs); err != nil {
		t.Fatal(err)
	}
	// A row by its REPLICA column: the id right before the role.
	rows := map[string]string{}
	row := regexp.MustCompile(`\s(r\d)\s+(leader|follower)\s`)
	for _, l := range strings.Split(out.String(), "\n") {
		if m := row.FindStringSubmatch(l); m != nil {
			rows[m[1]] = l
		}
	}
	if !strings.Contains(rows["r2"], "not fetching: r1 has waited 6.3s for its next fetch") {
		t.Errorf("r2's row = %q, want it said not fetching", rows["r2"])
	}
	if strings.Contains(rows["r3"], "not fetching") || strings.Contains(rows["r1"], "not fetching") {
		t.Errorf("rows r1 %q, r3 %q: want no not-fetching note", rows["r1"], rows["r3"])
	}
	// r3 still fetches: with the leader, a quorum of three.
	if strings.Contains(out.String(), "STALLED") {
		t.Errorf("status = %q, want no stall with one of two followers fetching", out.String())
	}
	// Neither fetches: the leader commits nothing, whatever its lease says.
	rs[0].members[0].status.Followers[1].FetchWaitingMs = 4000
	out.Reset()
	if err := writeStatusTable(&out, rs); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "; COMMITS STALLED: 0 of 2 followers fetching, 1 needed") {
		t.Errorf("status = %q, want the leader's row to say commits stalled", out.String())
	}
	out.Reset()
	if err := writeStatusJSON(&out, rs, promoterView{elected: true}); err != nil {
		t.Fatal(err)
	}
	var stalled []statusJSON
	if err := json.Unmarshal(out.Bytes(), &stalled); err != nil || stalled[0].CommitsStalled != "COMMITS STALLED: 0 of 2 followers fetching, 1 needed" {
		t.Errorf("status --json commits_stalled = %q (%v), want the table's note", stalled[0].CommitsStalled, err)
	}
	rs[0].members[0].status.Followers[1].FetchWaitingMs = 20

	// r3 fetches, but its disk is full: it stores and acknowledges nothing,
	// so commits stall all the same (it used to count as fetching).
	rs[0].members[2].disk = &tenurev1.DiskStatus{Full: true}
	out.Reset()
	if err := writeStatusTable(&out, rs); err != nil {
		t.Fatal(err)
	}
	if want := "; COMMITS STALLED: 0 of 2 followers fetching and storing, 1 needed (1 more fetch, their disks full)"; !strings.Contains(out.String(), want) {
		t.Errorf("status = %q, want the leader's row to say %q", out.String(), want)
	}
	rs[0].members[2].disk = nil

	out.Reset()
	if err := writeStatusJSON(&out, rs, promoterView{elected: true}); err != nil {
		t.Fatal(err)
	}
	var got []statusJSON
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("status JSON %q: %v", out.String(), err)
	}
	r := got[0].Replicas
	if r[0].FetchWaitingMs != nil || r[1].FetchWaitingMs == nil || *r[1].FetchWaitingMs != 6340 || r[2].FetchWaitingMs == nil || *r[2].FetchWaitingMs != 20 {
		t.Errorf("JSON fetch_waiting_ms = %v, %v, %v; want none for the leader, 6340 for r2, 20 for r3", r[0].FetchWaitingMs, r[1].FetchWaitingMs, r[2].FetchWaitingMs)
	}
}

// A range mid-change: r4 is a learner, r3's disk was wiped (the replica
// reports the range lost), and the add of r4 is in flight.
func TestStatusShowsLearnersLostDisksAndChange(t *testing.T) {
	lost := memberStatus{replica: &tenurev1.Replica{Id: "r3", Incarnation: "aaaa"}, incarnation: "bbbb",
		lost: &tenurev1.LostRange{RangeId: "orders", MemberIncarnation: "aaaa"}}
	lost.err = errors.New("INCARNATION MISMATCH: the member is incarnation aaaa, the replica answering is bbbb")
	rs := []rangeStatus{{
		info: &tenurev1.RangeInfo{RangeId: "orders", Epoch: 4, Change: &tenurev1.MembershipChange{
			Step: tenurev1.MembershipStep_MEMBERSHIP_STEP_ADD_LEARNER, ReplicaId: "r4", Epoch: 4,
			OldReplicas: []*tenurev1.Replica{{Id: "r1"}, {Id: "r2"}, {Id: "r3"}}}},
		members: []memberStatus{
			{replica: &tenurev1.Replica{Id: "r1"}, status: &tenurev1.RangeStatus{RangeId: "orders", Role: tenurev1.Role_ROLE_LEADER, Epoch: 4, FencedEpoch: 4, LogEnd: 9, HighWaterMark: 9, LeaseValid: true}},
			{replica: &tenurev1.Replica{Id: "r2"}, status: &tenurev1.RangeStatus{RangeId: "orders", Role: tenurev1.Role_ROLE_FOLLOWER, Epoch: 4, FencedEpoch: 4, LogEnd: 9, HighWaterMark: 9}},
			lost,
			{replica: &tenurev1.Replica{Id: "r4", Learner: true}, status: &tenurev1.RangeStatus{RangeId: "orders", Role: tenurev1.Role_ROLE_FOLLOWER, Epoch: 4, FencedEpoch: 4, LogEnd: 3, HighWaterMark: 3}},
		},
	}}
	var out bytes.Buffer
	if err := writeStatusTable(&out, rs); err != nil {
		t.Fatal(err)
	}
	wantLines(t, "status", out.String(),
		"r3 lost - - - - - - INCARNATION MISMATCH",
		"r4 follower (learner) 4",
		"range orders: membership change in flight: add-learner r4 since epoch 4")
	out.Reset()
	if err := writeStatusJSON(&out, rs, promoterView{elected: true}); err != nil {
		t.Fatal(err)
	}
	var got []statusJSON
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if g := got[0]; g.Change != "add-learner r4 since epoch 4" || !g.Replicas[2].IncarnationMismatch || g.Replicas[2].Answered != "bbbb" || !g.Replicas[3].Learner || g.Replicas[1].Learner {
		t.Errorf("status JSON = %s, want the change, r3's mismatch and r4 a learner", out.String())
	}
}
