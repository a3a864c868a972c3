package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// etcdTryTimeout bounds one try to reach etcd at start. A reachable etcd
// answers in milliseconds; the etcd client does not fail a call to an
// endpoint that refuses connections, it waits for the call's deadline, so
// this bound is also how soon the first warning is out.
const etcdTryTimeout = time.Second

// etcdWarnEvery is how often a server still waiting for etcd says so again
// after its first warning: visible, without a line a second.
const etcdWarnEvery = 5 * time.Second

// etcdDialTimeout bounds the TCP dial that says why etcd did not answer.
const etcdDialTimeout = 500 * time.Millisecond

// waitForEtcd returns once etcd at endpoints answers a linearizable read
// of key (which needs its quorum, as every grant does; the caller's own
// prefix, which any access control lets it read), or an error once ctx
// ends. The lease service stayed silent for its whole start bound when
// etcd was down or the address wrong; now the first failed try is logged
// at once at warn level, naming the endpoints and why (a refused
// connection, say), and again every etcdWarnEvery while it keeps trying.
func waitForEtcd(ctx context.Context, cli *clientv3.Client, endpoints, key string, log *slog.Logger) error {
	began := time.Now()
	var warned time.Time
	for {
		try := time.Now()
		tctx, cancel := context.WithTimeout(ctx, etcdTryTimeout)
		_, err := cli.Get(tctx, key, clientv3.WithCountOnly())
		cancel()
		if err == nil {
			if !warned.IsZero() {
				log.Info("reached etcd", "etcd", endpoints, "waited", since(began))
			}
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("cannot reach etcd at %s: %s", endpoints, etcdUnreachable(endpoints, err))
		}
		if warned.IsZero() || time.Since(warned) >= etcdWarnEvery {
			log.Warn("cannot reach etcd; retrying", "etcd", endpoints, "err", etcdUnreachable(endpoints, err), "waited", since(began))
			warned = time.Now()
		}
		// A try that failed fast (a refusal from etcd itself) waits out
		// the rest of its second: at most a try a second.
		select {
		case <-ctx.Done():
		case <-time.After(etcdTryTimeout - time.Since(try)):
		}
	}
}

// etcdUnreachable says why etcd did not answer: when no endpoint accepts a
// TCP connection (a wrong address, etcd not up yet) the dial errors, which
// name the cause; otherwise the client's error.
func etcdUnreachable(endpoints string, callErr error) string {
	var dialErrs []string
	for _, ep := range strings.Split(endpoints, ",") {
		hostPort := strings.TrimSpace(ep)
		if u, err := url.Parse(hostPort); err == nil && u.Host != "" {
			hostPort = u.Host
		}
		c, err := net.DialTimeout("tcp", hostPort, etcdDialTimeout)
		if err == nil {
			c.Close()
			if errors.Is(callErr, context.DeadlineExceeded) {
				return fmt.Sprintf("%s accepts connections but etcd did not answer within %v (no quorum? TLS or scheme mismatch?)", hostPort, etcdTryTimeout)
			}
			return callErr.Error()
		}
		dialErrs = append(dialErrs, err.Error())
	}
	return strings.Join(dialErrs, "; ")
}
