package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// A replica's fetch-time truncations show in its row (how many records, how
// many times, where and when the last cut was) and in --json; a replica
// that cut nothing says nothing about it in the table and 0 in JSON.
func TestStatusShowsFetchTruncations(t *testing.T) {
	at := time.Now().Add(-5 * time.Second).UnixMilli()
	rs := []rangeStatus{{
		info: &tenurev1.RangeInfo{RangeId: "orders", Epoch: 2},
		members: []memberStatus{
			{replica: &tenurev1.Replica{Id: "r1"}, status: &tenurev1.RangeStatus{RangeId: "orders", Role: tenurev1.Role_ROLE_FOLLOWER, Epoch: 2, FencedEpoch: 2, LogEnd: 8, HighWaterMark: 8,
				FetchTruncations: 1, FetchTruncatedRecords: 3, LastFetchTruncationFrom: 7, LastFetchTruncationTo: 4, LastFetchTruncationEpoch: 2, LastFetchTruncationLeader: "r2", LastFetchTruncationUnixMs: at}},
			{replica: &tenurev1.Replica{Id: "r2"}, status: &tenurev1.RangeStatus{RangeId: "orders", Role: tenurev1.Role_ROLE_LEADER, Epoch: 2, FencedEpoch: 2, LogEnd: 8, HighWaterMark: 8, LeaseValid: true}},
		},
	}}
	var out bytes.Buffer
	if err := writeStatusTable(&out, rs); err != nil {
		t.Fatal(err)
	}
	var r1, r2 string
	for _, l := range strings.Split(out.String(), "\n") {
		switch {
		case strings.Contains(l, " r1  "):
			r1 = l
		case strings.Contains(l, " r2  "):
			r2 = l
		}
	}
	// 5s ago when written; a slow run may render a second more.
	if !strings.Contains(r1, "cut 3 records at fetch (1 time); last 7->4 at epoch 2, following r2, ") || !strings.Contains(r1, "s ago") {
		t.Errorf("r1's row = %q, want its fetch truncations", r1)
	}
	if strings.Contains(r2, "cut ") {
		t.Errorf("r2's row = %q, want no truncation note", r2)
	}

	out.Reset()
	if err := writeStatusJSON(&out, rs, promoterView{elected: true}); err != nil {
		t.Fatal(err)
	}
	var got []statusJSON
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("status JSON %q: %v", out.String(), err)
	}
	j1, j2 := got[0].Replicas[0], got[0].Replicas[1]
	want := fetchTruncationJSON{From: 7, To: 4, Epoch: 2, Leader: "r2", UnixMs: at}
	if j1.FetchTruncations != 1 || j1.FetchTruncatedRecords != 3 || j1.LastFetchTruncation == nil || *j1.LastFetchTruncation != want {
		t.Errorf("r1 JSON truncations %d (%d records), last %+v; want 1 (3), %+v", j1.FetchTruncations, j1.FetchTruncatedRecords, j1.LastFetchTruncation, want)
	}
	if j2.FetchTruncations != 0 || j2.LastFetchTruncation != nil || !strings.Contains(out.String(), `"fetch_truncations": 0`) {
		t.Errorf("r2 JSON truncations %d, last %+v; want 0 and no last", j2.FetchTruncations, j2.LastFetchTruncation)
	}
}
