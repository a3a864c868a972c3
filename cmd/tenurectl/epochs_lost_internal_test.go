package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/journal"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// A member whose disk was replaced or wiped answers, as another
// incarnation, that it does not host the range. epochs showed it as
// "r3 (unreachable)" with "no history: ... not hosted by replica r3 (no
// fence has named it)", while status called it lost (INCARNATION
// MISMATCH) and a fence had named it and been refused. Now epochs says
// lost and why, in the table and in --json.
func TestEpochsShowsALostMember(t *testing.T) {
	lost := memberStatus{replica: &tenurev1.Replica{Id: "r3", Incarnation: "aaaa"}, incarnation: "bbbb",
		lost: &tenurev1.LostRange{RangeId: "orders", MemberIncarnation: "aaaa"}}
	lost.err = errors.New("INCARNATION MISMATCH: the member is incarnation aaaa, the replica answering is bbbb (its disk was replaced or wiped); it does not serve the range: rebuild it from its peers with 'tenurectl range rebuild orders --replica r3'")
	notHosted := connect.NewError(connect.CodeNotFound, errors.New(`replica: range "orders" is not hosted by replica r3 (no fence has named it)`))
	history := []journal.EpochStart{{Epoch: 1, Start: 0}, {Epoch: 2, Start: 5}}
	hs := []historyOf{
		{member: memberStatus{replica: &tenurev1.Replica{Id: "r1"}, status: &tenurev1.RangeStatus{RangeId: "orders", Role: tenurev1.Role_ROLE_LEADER, Epoch: 2, FencedEpoch: 2, LogEnd: 9, HighWaterMark: 9, LeaseValid: true}},
			history: history, logEnd: 9, hwm: 9},
		{member: memberStatus{replica: &tenurev1.Replica{Id: "r2"}, status: &tenurev1.RangeStatus{RangeId: "orders", Role: tenurev1.Role_ROLE_FOLLOWER, Epoch: 2, FencedEpoch: 2, LogEnd: 9, HighWaterMark: 9}},
			history: history, logEnd: 9, hwm: 9},
		{member: lost, err: notHosted},
	}
	var out bytes.Buffer
	if err := writeEpochsTable(&out, "orders", hs, 0, true); err != nil {
		t.Fatal(err)
	}
	wantLines(t, "epochs", out.String(), "r1 (leader) r2 (follower) r3 (lost)", "r3: lost: INCARNATION MISMATCH")
	if s := out.String(); strings.Contains(s, "unreachable") || strings.Contains(s, "no fence has named it") || !strings.Contains(s, "tenurectl range rebuild orders --replica r3") {
		t.Errorf("epochs with r3 lost:\n%s\nwant r3 lost with the rebuild command; not unreachable, not 'no fence has named it'", s)
	}

	out.Reset()
	if err := writeEpochsJSON(&out, "orders", hs, 0, true); err != nil {
		t.Fatal(err)
	}
	var got epochsJSON
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("epochs JSON %q: %v", out.String(), err)
	}
	if r3 := got.Replicas[2]; r3.Role != "lost" || !strings.Contains(r3.Error, "INCARNATION MISMATCH") {
		t.Errorf("epochs JSON for r3 = %+v, want role lost and the mismatch as its error", r3)
	}
}

// A replica whose log diverges from the leader's below its own HWM holds
// committed records the leader lacks (here: acknowledged at epoch 13 by b3
// and a follower that was later started on an older copy of its disk).
// It never truncates below its HWM: it halts. epochs said its records
// "are another leadership's and are cut when it fetches", which is false
// and hides that acknowledged records sit only there.
func TestEpochsDivergenceBelowTheHWMIsNotACut(t *testing.T) {
	leader := []journal.EpochStart{{Epoch: 1, Start: 0}, {Epoch: 13, Start: 3543}, {Epoch: 15, Start: 3544}}
	hs := []historyOf{
		{member: memberStatus{replica: &tenurev1.Replica{Id: "b1"}, status: &tenurev1.RangeStatus{Role: tenurev1.Role_ROLE_LEADER}}, history: leader, logEnd: 3546, hwm: 3546},
		{member: memberStatus{replica: &tenurev1.Replica{Id: "b3"}, status: &tenurev1.RangeStatus{Role: tenurev1.Role_ROLE_FENCED}},
			history: []journal.EpochStart{{Epoch: 1, Start: 0}, {Epoch: 13, Start: 3543}}, logEnd: 3574, hwm: 3574},
		{member: memberStatus{replica: &tenurev1.Replica{Id: "b2"}, status: &tenurev1.RangeStatus{Role: tenurev1.Role_ROLE_FOLLOWER}},
			history: []journal.EpochStart{{Epoch: 1, Start: 0}, {Epoch: 13, Start: 3543}, {Epoch: 14, Start: 3544}}, logEnd: 3546, hwm: 3544},
	}
	var out bytes.Buffer
	if err := writeEpochsTable(&out, "bo", hs, 0, true); err != nil {
		t.Fatal(err)
	}
	wantLines(t, "epochs", out.String(),
		"b3: diverges at offset 3544, below its HWM 3574: its records 3544..3573 were committed under another leadership and are NOT cut",
		// Above its HWM a divergence is an uncommitted tail: cut at fetch.
		"b2: diverges at offset 3544: its records 3544..3545 are another leadership's and are cut when it fetches")
}
