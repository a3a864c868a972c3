package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
	"github.com/tenurelog/tenure/services/lease/leasetest"
	"github.com/tenurelog/tenure/services/replica"
)

// status of every range asks each replica once, not once per range: asked
// range by range, a replica that does not answer (a frozen process) cost
// the 5 s call timeout per range, 16 ranges at a time, so status took
// minutes at 1,000 ranges, in the incident it is run for. A real lease
// service and a real replica (hosting none of the ranges yet) behind a
// counter of the GetStatus calls it gets; the other member refuses
// connections.
func TestStatusOfManyRangesAsksEachReplicaOnce(t *testing.T) {
	ls := leasetest.Start(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r, err := replica.New(replica.Config{ID: "r1", DataDir: t.TempDir(), Address: "http://" + ln.Addr().String(), Logger: quietLogger()})
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	var calls atomic.Int64
	regs := r.Handlers()
	for i := range regs {
		h := regs[i].Handler
		regs[i].Handler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if req.URL.Path == tenurev1connect.ReplicaServiceGetStatusProcedure {
				calls.Add(1)
			}
			h.ServeHTTP(w, req)
		})
	}
	srv := transport.ServeListener(ln, regs...)
	t.Cleanup(func() { srv.Close() })

	const ranges = 40
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	members := []*tenurev1.Replica{{Id: "r1", Address: srv.URL()}, {Id: "r2", Address: "http://127.0.0.1:" + closedPort(t)}}
	for i := range ranges {
		if _, err := ls.Client.CreateRange(ctx, connect.NewRequest(&tenurev1.CreateRangeRequest{RangeId: fmt.Sprintf("many-%d", i), Replicas: members})); err != nil {
			t.Fatal(err)
		}
	}

	var out, errOut bytes.Buffer
	e := &env{stdout: &out, stderr: &errOut, stdin: strings.NewReader(""), getenv: func(string) string { return "" }}
	if code := run(ctx, e, []string{"--lease", ls.Server.URL(), "--promoter", "http://127.0.0.1:" + closedPort(t), "status"}); code != exitOK {
		t.Fatalf("status: exit %d\n%s\n%s", code, out.String(), errOut.String())
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("status of %d ranges made %d GetStatus calls to r1, want 1", ranges, n)
	}
	got := normalize(out.String())
	for i := range ranges {
		if !strings.Contains(got, fmt.Sprintf("many-%d 0 none r1 unreachable - - - - - - does not host the range yet", i)) {
			t.Fatalf("status lacks range many-%d's row from r1's one answer:\n%s", i, out.String())
		}
	}
	if want := fmt.Sprintf("%d of %d ranges with a problem", ranges, ranges); !strings.Contains(got, want) {
		t.Errorf("status =\n%s\nwant the last line to say %q", out.String(), want)
	}
	// Each problem named for what it is: r1 answered (one call) without
	// the range, r2 refused the connection.
	out.Reset()
	if code := run(ctx, e, []string{"--lease", ls.Server.URL(), "--promoter", "http://127.0.0.1:" + closedPort(t), "status", "--json", "--problems"}); code != exitOK {
		t.Fatalf("status --json --problems: exit %d\n%s", code, errOut.String())
	}
	var st []statusJSON
	if err := json.Unmarshal(out.Bytes(), &st); err != nil || len(st) != ranges {
		t.Fatalf("status --json --problems: %v, %d ranges, want %d", err, len(st), ranges)
	}
	want := []string{"no serving leader", "r1 does not host the range", "r2 unreachable"}
	if !slices.Equal(st[0].Problems, want) {
		t.Errorf("range %s's problems = %q, want %q", st[0].Range, st[0].Problems, want)
	}
}
