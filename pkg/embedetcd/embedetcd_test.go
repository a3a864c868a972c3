package embedetcd_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
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

// TestOldRevisionsAreCompacted: the member compacts its history by itself,
// so a deployment that writes for months does not fill etcd's backend
// quota. A revision older than CompactionRetention becomes unreadable.
func TestOldRevisionsAreCompacted(t *testing.T) {
	old := embedetcd.CompactionRetention
	embedetcd.CompactionRetention = time.Second
	defer func() { embedetcd.CompactionRetention = old }()
	e, err := embedetcd.Start(t.TempDir())
	if err != nil {
		t.Fatalf("Start() = %v", err)
	}
	defer e.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("clientv3.New() = %v", err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	first, err := cli.Put(ctx, "k", "v1")
	if err != nil {
		t.Fatalf("Put() = %v", err)
	}
	// Periodic compaction compacts at the revision it saw a retention ago,
	// so keep writing: each put gives it a newer revision to compact to.
	// Bounded: 200 puts 100 ms apart.
	for i := 0; i < 200; i++ {
		if _, err := cli.Put(ctx, "k", "v2"); err != nil {
			t.Fatalf("Put() = %v", err)
		}
		_, err := cli.Get(ctx, "k", clientv3.WithRev(first.Header.Revision))
		if errors.Is(err, rpctypes.ErrCompacted) {
			return
		}
		if err != nil {
			t.Fatalf("Get(rev %d) = %v, want a value or ErrCompacted", first.Header.Revision, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("revision %d still readable after 20 s with a retention of %v: no auto-compaction", first.Header.Revision, embedetcd.CompactionRetention)
}

// TestSecondMemberOnADirectoryInUseFails: a second Start on a directory a
// running member holds returns ErrDirInUse at once. etcd itself waits for
// its bbolt file's lock without a bound, so before the probe this Start
// never returned (tenure dev on a data dir whose etcd another process held
// hung silently).
func TestSecondMemberOnADirectoryInUseFails(t *testing.T) {
	dir := t.TempDir()
	e, err := embedetcd.Start(dir)
	if err != nil {
		t.Fatalf("Start() = %v", err)
	}
	defer e.Close()
	done := make(chan error, 1)
	go func() {
		second, err := embedetcd.Start(dir)
		if err == nil {
			second.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, embedetcd.ErrDirInUse) {
			t.Fatalf("second Start() = %v, want ErrDirInUse", err)
		}
		t.Logf("second Start(): %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("second Start() on a directory in use did not return within 20s")
	}
	// The first member is untouched: it still serves after the refusal.
	e.Stop()
	if err := e.Restart(); err != nil {
		t.Fatalf("Restart() after the refused second start = %v", err)
	}
}
