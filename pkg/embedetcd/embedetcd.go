// Package embedetcd runs a single-member etcd server inside the process, for
// tests and the embedded dev cluster. It is the real etcd server
// (go.etcd.io/etcd/server/v3/embed), not a fake: leases, watches, compaction
// and restarts behave exactly as they do in a deployment.
//
// The member listens on 127.0.0.1 only, on ports picked at run time, below
// the kernel's ephemeral range (freeURLs). embed cannot listen on ":0" and
// report the port back, so Start binds a free port, closes it and hands it
// to etcd; another process may grab the port in between, so a start that
// fails with "address in use" is retried on new ports.
//
// Stop and Restart keep the data directory and the ports, so clients that
// dialled Endpoints reconnect by themselves once the member is back: that is
// how tests take etcd away from a running service and give it back.
package embedetcd

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/tenurelog/tenure/internal/freeport"
)

const (
	// startAttempts bounds the retries of a start that lost its ports to
	// another process between picking and binding them.
	startAttempts = 5

	// readyTimeout bounds how long Start waits for the member to elect itself
	// and serve. A single member elects itself within one election timeout
	// (1 s by default); the rest is headroom for a loaded test machine.
	readyTimeout = 30 * time.Second
)

// ErrDirInUse is returned by Start and Restart when another process (or
// another member in this one) already runs etcd on the data directory.
var ErrDirInUse = errors.New("data directory in use")

// CompactionRetention is the history the member keeps: etcd's periodic
// auto-compaction (--auto-compaction-mode=periodic) discards revisions
// older than this. Without it etcd keeps every revision of every key, and a
// cluster that renews leases and writes epochs for months fills its backend
// (etcd's own quota, 2 GiB by default, then refuses every write). An hour
// is etcd's documented example and far longer than any watch here is
// behind: a lease watcher that falls further back re-reads the current
// state (services/lease/watch.go). A variable so a test can watch a
// compaction happen.
var CompactionRetention = time.Hour

// Etcd is an embedded single-member etcd server. Its methods are safe for
// concurrent use.
type Etcd struct {
	dir       string
	clientURL url.URL
	peerURL   url.URL

	mu sync.Mutex
	// srv is the running server; nil while stopped.
	srv *embed.Etcd
}

// Start starts a member that stores its data in dir (created if missing;
// an existing member's data is reopened) and listens on free 127.0.0.1 ports.
func Start(dir string) (*Etcd, error) {
	var lastErr error
	for range startAttempts {
		clientURL, peerURL, err := freeURLs()
		if err != nil {
			return nil, err
		}
		e := &Etcd{dir: dir, clientURL: clientURL, peerURL: peerURL}
		err = e.start()
		if err == nil {
			return e, nil
		}
		lastErr = err
		if !addrInUse(err) {
			break
		}
	}
	return nil, lastErr
}

// Endpoints are the client URLs to pass to clientv3.Config.Endpoints. They
// stay the same across Stop and Restart.
func (e *Etcd) Endpoints() []string { return []string{e.clientURL.String()} }

// Dir is the data directory.
func (e *Etcd) Dir() string { return e.dir }

// Stop stops the member, keeping its data and ports for Restart. Stopping a
// stopped member does nothing.
func (e *Etcd) Stop() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.srv != nil {
		e.srv.Close()
		e.srv = nil
	}
}

// Restart stops the member if it runs, then starts it again on the same data
// directory and ports. Because the ports were released by Stop, another
// process could take them meanwhile; Restart then fails rather than moving,
// since clients only know the old endpoints. It retries briefly first, for a
// port still held by the stopping server's own sockets.
func (e *Etcd) Restart() error {
	e.Stop()
	var err error
	for attempt := range startAttempts {
		if attempt > 0 {
			time.Sleep(100 * time.Millisecond)
		}
		if err = e.start(); err == nil || !addrInUse(err) {
			return err
		}
	}
	return err
}

// Close stops the member. The data directory is left for its owner
// (t.TempDir removes its own).
func (e *Etcd) Close() { e.Stop() }

func (e *Etcd) start() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.srv != nil {
		return nil
	}
	cfg := embed.NewConfig()
	cfg.Name = "embedded"
	cfg.Dir = e.dir
	cfg.ListenClientUrls = []url.URL{e.clientURL}
	cfg.AdvertiseClientUrls = []url.URL{e.clientURL}
	cfg.ListenPeerUrls = []url.URL{e.peerURL}
	cfg.AdvertisePeerUrls = []url.URL{e.peerURL}
	cfg.InitialCluster = cfg.Name + "=" + e.peerURL.String()
	// Quiet: etcd's own logging is zap, a second logger next to slog. The
	// member's failures reach callers as errors from Start or from clients.
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	// No gRPC gateway or metrics listener: nothing here uses them, and each
	// would be one more port to find.
	cfg.EnableGRPCGateway = false
	cfg.AutoCompactionMode = "periodic"
	cfg.AutoCompactionRetention = CompactionRetention.String()

	// etcd waits for its bbolt file's lock without a bound: with another
	// etcd (or another process of ours) on dir, StartEtcd never returned,
	// and the ready timeout below never started. Probe the lock first and
	// say who is in the way. A holder that appears between the probe and
	// the open still blocks etcd; the probe covers the common case, a
	// second process started on the same directory.
	db := filepath.Join(e.dir, "member", "snap", "db")
	if busy, err := lockedByOther(db); err != nil {
		return fmt.Errorf("embedetcd: check %s: %w", db, err)
	} else if busy {
		return fmt.Errorf("embedetcd: %w: %s is locked by another etcd or process using %s; stop it or use another directory", ErrDirInUse, db, e.dir)
	}

	srv, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("embedetcd: start in %s: %w", e.dir, err)
	}
	select {
	case <-srv.Server.ReadyNotify():
	case err := <-srv.Err():
		srv.Close()
		return fmt.Errorf("embedetcd: start in %s: %w", e.dir, err)
	case <-time.After(readyTimeout):
		srv.Close()
		return fmt.Errorf("embedetcd: member in %s not ready after %v", e.dir, readyTimeout)
	}
	e.srv = srv
	return nil
}

// addrInUse reports whether a start failed because a port was taken. etcd
// does not always wrap the listener's error, so the text is checked too.
func addrInUse(err error) bool {
	return errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use")
}

// freeURLs picks two free loopback ports, one for clients and one for peers.
// Both listeners are held until both ports are known, so the two differ.
//
// The ports come from below the kernel's ephemeral range where it can be
// read (internal/freeport): a port Stop released is then taken by nobody
// but a listener on that very port. One from the ephemeral range (what ":0"
// hands out) could become any outgoing connection's local port, or
// another listener's, while the member was stopped: Restart then failed
// with "address already in use" (TestKeeperInvalidWhileEtcdIsDown in CI,
// with other packages' tests running beside it).
func freeURLs() (client, peer url.URL, err error) {
	var ports [2]int
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	for i := range ports {
		ln, err := freeport.Listen()
		if err != nil {
			return url.URL{}, url.URL{}, fmt.Errorf("embedetcd: pick a free port: %w", err)
		}
		lns = append(lns, ln)
		ports[i] = ln.Addr().(*net.TCPAddr).Port
	}
	client = url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[0])}
	peer = url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[1])}
	return client, peer, nil
}
