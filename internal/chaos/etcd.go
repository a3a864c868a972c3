package chaos

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/tenurelog/tenure/internal/freeport"
	"github.com/tenurelog/tenure/pkg/embedetcd"
)

// etcdCluster is the etcd a run's lease service and promoters use: one
// member (pkg/embedetcd) for the kinds that leave etcd alone, or three
// embedded members for the etcd kinds, which fault one member or a
// majority. pkg/embedetcd runs a single member only, so the three-member
// cluster is built here from go.etcd.io/etcd/server/v3/embed.
//
// Faults on members: Isolate cuts a member's raft traffic to and from
// every other member (EtcdServer.CutPeer on both sides, as etcd's own
// integration tests partition members); its clients still reach it, and
// what needs a quorum fails or times out there. Pause is Isolate plus its
// client port's proxy holding every byte both ways, as a stopped process's
// sockets do: a client pinned to it hangs rather than hearing an error.
// Like Network's pause, a paused member's timers keep running.
type etcdCluster struct {
	t testing.TB
	// single is the one-member etcd; nil for three members.
	single  *embedetcd.Etcd
	members []*etcdMember
}

type etcdMember struct {
	name       string
	clientURL  url.URL // the member's own client listener
	peerURL    url.URL
	proxy      *tcpProxy // what clients dial
	srv        *embed.Etcd
	pausedByUs bool
}

// etcdStartAttempts bounds retries of a three-member start that lost a
// port to another process between picking and binding it.
const etcdStartAttempts = 3

func startEtcd(t testing.TB, members int) *etcdCluster {
	t.Helper()
	c := &etcdCluster{t: t}
	if members <= 1 {
		e, err := embedetcd.Start(t.TempDir())
		if err != nil {
			t.Fatalf("etcd: %v", err)
		}
		t.Cleanup(e.Close)
		c.single = e
		return c
	}
	var err error
	for range etcdStartAttempts {
		if err = c.startMembers(members); err == nil || !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	if err != nil {
		t.Fatalf("etcd cluster: %v", err)
	}
	t.Cleanup(c.close)
	return c
}

func (c *etcdCluster) startMembers(n int) error {
	c.members = nil
	var lns []net.Listener
	// Below the ephemeral range (internal/freeport): between these
	// listeners' close and the members' bind, a port from ":0" could
	// become any other test's connection's or listener's.
	port := func() (url.URL, error) {
		ln, err := freeport.Listen()
		if err != nil {
			return url.URL{}, err
		}
		lns = append(lns, ln)
		return url.URL{Scheme: "http", Host: ln.Addr().String()}, nil
	}
	var initial []string
	for i := 1; i <= n; i++ {
		m := &etcdMember{name: fmt.Sprintf("e%d", i)}
		var err error
		if m.clientURL, err = port(); err != nil {
			return err
		}
		if m.peerURL, err = port(); err != nil {
			return err
		}
		initial = append(initial, m.name+"="+m.peerURL.String())
		c.members = append(c.members, m)
	}
	// Held until every port is known, so they all differ.
	for _, ln := range lns {
		ln.Close()
	}
	dirs := make([]string, n)
	for i := range dirs {
		dirs[i] = c.t.TempDir()
	}
	// Members start together: none is ready before a quorum is.
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, m := range c.members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := embed.NewConfig()
			cfg.Name = m.name
			cfg.Dir = dirs[i]
			cfg.ListenClientUrls = []url.URL{m.clientURL}
			cfg.AdvertiseClientUrls = []url.URL{m.clientURL}
			cfg.ListenPeerUrls = []url.URL{m.peerURL}
			cfg.AdvertisePeerUrls = []url.URL{m.peerURL}
			cfg.InitialCluster = strings.Join(initial, ",")
			cfg.InitialClusterToken = "chaos"
			cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
			cfg.EnableGRPCGateway = false
			srv, err := embed.StartEtcd(cfg)
			if err != nil {
				errs[i] = err
				return
			}
			select {
			case <-srv.Server.ReadyNotify():
				m.srv = srv
			case err := <-srv.Err():
				srv.Close()
				errs[i] = err
			case <-time.After(30 * time.Second):
				srv.Close()
				errs[i] = fmt.Errorf("member %s not ready after 30s", m.name)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.close()
		return err
	}
	for _, m := range c.members {
		p, err := newTCPProxy(m.clientURL.Host)
		if err != nil {
			c.close()
			return err
		}
		m.proxy = p
	}
	return nil
}

// Endpoints are what the lease service and the promoters dial.
func (c *etcdCluster) Endpoints() []string {
	if c.single != nil {
		return c.single.Endpoints()
	}
	var out []string
	for _, m := range c.members {
		out = append(out, "http://"+m.proxy.Addr())
	}
	return out
}

func (c *etcdCluster) close() {
	for _, m := range c.members {
		if m.proxy != nil {
			m.proxy.Close()
		}
		if m.srv != nil {
			m.srv.Close()
		}
	}
}

// leader is the member the others follow now, or nil.
func (c *etcdCluster) leader() *etcdMember {
	for _, m := range c.members {
		if uint64(m.srv.Server.Leader()) == uint64(m.srv.Server.MemberID()) {
			return m
		}
	}
	return nil
}

// Isolate cuts m's raft traffic both ways with every other member.
func (c *etcdCluster) Isolate(m *etcdMember) {
	for _, o := range c.members {
		if o != m {
			m.srv.Server.CutPeer(o.srv.Server.MemberID())
			o.srv.Server.CutPeer(m.srv.Server.MemberID())
		}
	}
}

// Pause isolates m and stops its client port passing bytes.
func (c *etcdCluster) Pause(m *etcdMember) {
	c.Isolate(m)
	m.proxy.Pause()
	m.pausedByUs = true
}

// Heal mends every cut and resumes every paused member.
func (c *etcdCluster) Heal() {
	for _, m := range c.members {
		for _, o := range c.members {
			if o != m {
				m.srv.Server.MendPeer(o.srv.Server.MemberID())
			}
		}
		if m.pausedByUs {
			m.proxy.Resume()
			m.pausedByUs = false
		}
	}
}

// tcpProxy forwards connections to target and can hold every byte both
// ways (Pause) until Resume.
type tcpProxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	paused chan struct{} // closed on Resume; nil while running
	conns  map[net.Conn]struct{}
	closed chan struct{}
	wg     sync.WaitGroup
}

func newTCPProxy(target string) (*tcpProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &tcpProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}, closed: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *tcpProxy) Addr() string { return p.ln.Addr().String() }

func (p *tcpProxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			in.Close()
			continue
		}
		if !p.track(in, out) {
			return
		}
		p.wg.Add(2)
		go p.pipe(in, out)
		go p.pipe(out, in)
	}
}

// track registers a connection pair; false once the proxy is closed.
func (p *tcpProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.closed:
		for _, c := range cs {
			c.Close()
		}
		return false
	default:
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

// pipe copies src to dst, holding each chunk it read while paused. Either
// side's end closes both.
func (p *tcpProxy) pipe(src, dst net.Conn) {
	defer p.wg.Done()
	defer func() {
		src.Close()
		dst.Close()
		p.mu.Lock()
		delete(p.conns, src)
		delete(p.conns, dst)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.wait() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or a closed side: the other copy ends too
		}
	}
}

// wait blocks while paused (bounded by maxPause, as Network's pause is);
// false once the proxy is closed.
func (p *tcpProxy) wait() bool {
	p.mu.Lock()
	ch := p.paused
	p.mu.Unlock()
	if ch == nil {
		return true
	}
	select {
	case <-ch:
		return true
	case <-p.closed:
		return false
	case <-time.After(maxPause):
		return true
	}
}

func (p *tcpProxy) Pause() {
	p.mu.Lock()
	if p.paused == nil {
		p.paused = make(chan struct{})
	}
	p.mu.Unlock()
}

func (p *tcpProxy) Resume() {
	p.mu.Lock()
	if p.paused != nil {
		close(p.paused)
		p.paused = nil
	}
	p.mu.Unlock()
}

// Close stops accepting, drops every connection and waits for the copies.
func (p *tcpProxy) Close() {
	p.mu.Lock()
	select {
	case <-p.closed:
		p.mu.Unlock()
		return
	default:
	}
	close(p.closed)
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}
