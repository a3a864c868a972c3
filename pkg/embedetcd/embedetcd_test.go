package embedetcd_test

import (
	"context"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tenurelog/tenure/pkg/embedetcd"
)

// TestRestartKeepsDataAndEndpoints is what the lease service's tests rely on:
// a client dialled before Stop reads, after Restart, what was written before,
// without being told anything new.
func TestRestartKeepsDataAndEndpoints(t *testing.T) {
	e, err := embedetcd.Start(t.TempDir())
	if err != nil {
		t.Fatalf("Start() = %v", err)
	}
	defer e.Close()
	before := e.Endpoints()

	cli, err := clientv3.New(clientv3.Config{Endpoints: before, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("clientv3.New() = %v", err)
	}
	defer cli.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "v1"); err != nil {
		t.Fatalf("Put() = %v", err)
	}

	e.Stop()
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = cli.Get(short, "k")
	cancelShort()
	if err == nil {
		t.Fatalf("Get() on a stopped member succeeded, want an error")
	}

	if err := e.Restart(); err != nil {
		t.Fatalf("Restart() = %v", err)
	}
	if got := e.Endpoints(); !slices.Equal(got, before) {
		t.Fatalf("Endpoints() after Restart = %v, want %v", got, before)
	}

	// The client reconnects by itself; bounded retries while it does.
	var got string
	for attempt := 0; attempt < 100 && got == ""; attempt++ {
		short, cancelShort := context.WithTimeout(ctx, time.Second)
		resp, err := cli.Get(short, "k")
		cancelShort()
		if err == nil && len(resp.Kvs) == 1 {
			got = string(resp.Kvs[0].Value)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got != "v1" {
		t.Fatalf("Get(k) after Restart = %q, want %q", got, "v1")
	}
}

// TestTwoMembersDoNotCollide: every caller gets its own ports.
func TestTwoMembersDoNotCollide(t *testing.T) {
	a, err := embedetcd.Start(t.TempDir())
	if err != nil {
		t.Fatalf("Start(a) = %v", err)
	}
	defer a.Close()
	b, err := embedetcd.Start(t.TempDir())
	if err != nil {
		t.Fatalf("Start(b) = %v", err)
	}
	defer b.Close()
	if slices.Equal(a.Endpoints(), b.Endpoints()) {
		t.Fatalf("two members share endpoints %v", a.Endpoints())
	}
}
