package chaos

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestEtcdFaults: the etcd kinds' faults really fault a three-member
// embedded etcd. An isolated member's clients cannot write (no quorum on
// its side) while the others' can; a paused member's clients hear
// nothing at all, not even an error; after Heal both write again.
func TestEtcdFaults(t *testing.T) {
	c := startEtcd(t, 3)
	eps := c.Endpoints()
	// One client per member, so each call lands where the test means.
	clients := make([]*clientv3.Client, len(eps))
	for i, ep := range eps {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: bound, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		defer cli.Close()
		clients[i] = cli
	}
	put := func(i int, within time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		_, err := clients[i].Put(ctx, "k", "v")
		return err
	}
	// Every member serves before any fault (bounded retries: the first
	// calls may race the clients' connections).
	for i := range clients {
		if !waitUntil(bound, func() bool { return put(i, time.Second) == nil }) {
			t.Fatalf("member %d: no put within %v before any fault", i, bound)
		}
	}

	c.Isolate(c.members[0])
	// Cut off, member 0 cannot commit; once the others elected a leader
	// of their own (an election timeout, 1 s), they can.
	if err := put(0, 1500*time.Millisecond); err == nil {
		t.Errorf("put through the isolated member succeeded")
	}
	if !waitUntil(bound, func() bool { return put(1, time.Second) == nil }) {
		t.Errorf("the majority side did not accept a put within %v", bound)
	}
	c.Heal()
	if !waitUntil(bound, func() bool { return put(0, time.Second) == nil }) {
		t.Fatalf("member 0 did not accept a put within %v of healing", bound)
	}

	c.Pause(c.members[2])
	ctx, cancel := context.WithTimeout(context.Background(), quiet)
	_, err := clients[2].Get(ctx, "k", clientv3.WithSerializable())
	cancel()
	// A serializable read needs no quorum: only a held connection keeps
	// it from answering.
	if err == nil {
		t.Errorf("a serializable read through the paused member answered")
	}
	c.Heal()
	if !waitUntil(bound, func() bool { return put(2, time.Second) == nil }) {
		t.Fatalf("member 2 did not accept a put within %v of resuming", bound)
	}
}
