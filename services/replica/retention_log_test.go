package replica_test

import (
	"bytes"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// Retention under steady load advances the log start of every range with a
// policy at every pass. It logged a line per range and pass at Info, which
// in a soak (160 ranges with small limits) was most of each replica's log
// and grew with ranges x passes forever. A pass that advances many ranges
// now logs one summary line at Info; the per-range line is Debug.
func TestRetentionLogsOneLinePerPassNotPerRange(t *testing.T) {
	const ranges = 24
	// Long enough that the policies, set all at once, are learned in one
	// refresh: the test counts lines per pass, not how fast passes run.
	const interval = 500 * time.Millisecond
	g := newRetentionReplica(t, true, interval)
	env, ctx, rc, lc, logs := g.lease, g.ctx, g.rc, g.lc, g.logs

	ids := make([]string, ranges)
	unlimited := &tenurev1.RetentionPolicy{}
	for i := range ids {
		ids[i] = fmt.Sprintf("ret%02d", i)
		if _, err := env.Client.CreateRange(ctx, connect.NewRequest(&tenurev1.CreateRangeRequest{
			RangeId: ids[i], Replicas: []*tenurev1.Replica{{Id: "r1", Address: g.url}}, Retention: unlimited,
		})); err != nil {
			t.Fatal(err)
		}
		if _, err := rc.Fence(ctx, connect.NewRequest(&tenurev1.FenceRequest{RangeId: ids[i], Epoch: 1, FencerId: "test"})); err != nil {
			t.Fatalf("Fence %s = %v", ids[i], err)
		}
		if _, err := rc.Adopt(ctx, connect.NewRequest(&tenurev1.AdoptRequest{RangeId: ids[i], Epoch: 1, Role: tenurev1.Role_ROLE_LEADER,
			LeaderId: "r1", Replicas: []*tenurev1.Replica{{Id: "r1", Address: "http://r1"}}, Retention: unlimited})); err != nil {
			t.Fatalf("Adopt %s = %v", ids[i], err)
		}
		for j := range 8 {
			if _, err := lc.Append(ctx, connect.NewRequest(&tenurev1.AppendRequest{RangeId: ids[i], Records: [][]byte{bytes.Repeat([]byte{byte('a' + j)}, 4<<10)}})); err != nil {
				t.Fatalf("Append %s = %v", ids[i], err)
			}
		}
	}
	// Every range over a 8 KiB limit at once: the next refresh learns all
	// the policies and that pass advances every range.
	small := &tenurev1.RetentionPolicy{MaxBytes: 8 << 10}
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Go(func() {
			if _, err := env.Client.SetRetention(ctx, connect.NewRequest(&tenurev1.SetRetentionRequest{RangeId: id, Retention: small})); err != nil {
				t.Errorf("SetRetention %s = %v", id, err)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := rc.GetStatus(ctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{}))
		if err != nil {
			t.Fatalf("GetStatus = %v", err)
		}
		advanced := 0
		for _, st := range resp.Msg.GetRanges() {
			if st.GetLogStart() > 0 {
				advanced++
			}
		}
		if advanced == ranges {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %d of %d ranges' log starts advanced", advanced, ranges)
		}
		time.Sleep(interval / 4)
	}
	// The summary follows the pass that advanced them.
	summary := regexp.MustCompile(`msg="retention advanced log starts".* ranges=(\d+)`)
	var lines []string
	counted := 0
	for {
		lines, counted = nil, 0
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, "retention advanced") {
				lines = append(lines, l)
			}
			if m := summary.FindStringSubmatch(l); m != nil {
				n, _ := strconv.Atoi(m[1])
				counted += n
			}
		}
		if counted >= ranges || time.Now().After(deadline) {
			break
		}
		time.Sleep(interval / 4)
	}
	if counted < ranges {
		t.Fatalf("summaries count %d ranges advanced, want %d; lines:\n%s", counted, ranges, strings.Join(lines, "\n"))
	}
	// One line per pass: the ranges advanced in one or two passes (a
	// refresh that ran between the SetRetention calls), never one line
	// per range.
	if len(lines) > 3 {
		t.Fatalf("%d retention lines at Info for %d ranges, want one per pass:\n%s", len(lines), ranges, strings.Join(lines, "\n"))
	}
}
