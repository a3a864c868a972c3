package bench

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
)

// BenchmarkFloor measures the least that any replicated log must do here
// for an append acknowledged with issue #3's durability, so that the other
// systems can be read against it: it is not a log, only its critical path.
//
// Three "replicas" in this process, each a goroutine or two and one file in
// a temp dir of its own (one file system, as the in-process benchmarks
// share it). A client sends a call's records to the leader over loopback
// TCP (a 4-byte length, an 8-byte call id, the bytes); the leader forwards
// them at once to both followers over loopback TCP and hands them to its
// own syncer; every replica writes what it has with one pwrite and one
// fdatasync (group commit) and a follower answers its durable end; the
// leader acknowledges a call once two of the three hold it durably (itself
// included only once its own fdatasync returned), over the client's
// connection. That is four loopback hops and two fdatasyncs on one disk on
// the critical path, as in tenure and any leader-based log with a quorum of
// two, and nothing else: no protocol beyond a length prefix, no checksums,
// no index, no epochs, no recovery. The files are written with zeros and
// synced before the run and then overwritten in a circle, so no fdatasync
// has a file size to commit.
func BenchmarkFloor(b *testing.B) {
	for _, shape := range Shapes {
		b.Run(shape.Name, func(b *testing.B) {
			c := startFloorCluster(b, false)
			runShape(b, c.newAppender, shape)
		})
	}
}

// BenchmarkFloorKept is BenchmarkFloor for a log that keeps its records:
// every replica appends to a file that grows, as a log's segments do, and
// fdatasyncs each write, file size and all, where BenchmarkFloor writes
// over a 16 MiB circle whose pages the page cache holds after one lap.
// tenure and JetStream keep every record, so each byte they take lands on
// a page the process has not used before; on some VMs a new page costs
// ten times a reused one (bench/results/2026-12-07.md). This benchmark
// says, on the machine at hand, whether the circle flatters the floor:
// read it side by side with BenchmarkFloor in one run.
func BenchmarkFloorKept(b *testing.B) {
	for _, shape := range Shapes {
		b.Run(shape.Name, func(b *testing.B) {
			c := startFloorCluster(b, true)
			runShape(b, c.newAppender, shape)
		})
	}
}

// floorFileBytes is the size of each replica's file, written over in a
// circle: large enough that a lap takes a while at any rate seen here,
// small enough to preallocate in a moment.
const floorFileBytes = 16 << 20

// floorFile is one replica's log file and its group-commit writer.
type floorFile struct {
	f *os.File
	// kept files grow: every write appends. The others are written over
	// in a circle.
	kept  bool
	pos   int64         // next write position (modulo floorFileBytes unless kept)
	syncs *atomic.Int64 // counts this file's fdatasyncs when set
}

// newFloorFile creates dir/log and syncs it and its directory. Unless
// kept, it writes the file full of zeros first, so that later writes
// overwrite allocated blocks.
func newFloorFile(dir string, kept bool) (*floorFile, error) {
	f, err := os.OpenFile(filepath.Join(dir, "log"), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	if !kept {
		if _, err := f.Write(make([]byte, floorFileBytes)); err != nil {
			f.Close()
			return nil, err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, err
	}
	d, err := os.Open(dir)
	if err == nil {
		err = d.Sync()
		d.Close()
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return &floorFile{f: f, kept: kept}, nil
}

// write writes p at the file's position (wrapping at its end unless kept)
// and fdatasyncs it.
func (w *floorFile) write(p []byte) error {
	for len(p) > 0 {
		n := int64(len(p))
		if !w.kept {
			n = min(n, floorFileBytes-w.pos)
		}
		if _, err := w.f.WriteAt(p[:n], w.pos); err != nil {
			return err
		}
		w.pos += n
		if !w.kept {
			w.pos %= floorFileBytes
		}
		p = p[n:]
	}
	if w.syncs != nil {
		w.syncs.Add(1)
	}
	return syscall.Fdatasync(int(w.f.Fd()))
}

// floorCluster is the leader and two followers, and the goroutines that
// serve them.
type floorCluster struct {
	leaderAddr string
	wg         sync.WaitGroup
	syncs      atomic.Int64 // fdatasyncs of the three replicas' writes (not of the setup)

	mu        sync.Mutex
	closed    bool
	err       error       // the first failure of a replica goroutine
	closers   []io.Closer // listeners and connections, closed by close
	followers []net.Conn  // the leader's connections to its followers
	end       uint64      // bytes the leader has accepted
	durable   [3]uint64   // durable ends: the leader's, then each follower's
	waiting   []floorCall // accepted calls not yet acknowledged, by end
	pending   []byte      // accepted bytes the leader's syncer has not taken
	wake      chan struct{}
}

// floorCall is an accepted call: acknowledged, with its id on its client's
// connection, once the quorum's durable end reaches end.
type floorCall struct {
	end  uint64
	id   uint64
	conn *floorConn
}

// floorConn is a client's connection on the leader; acknowledgements are
// written under the cluster's mutex.
type floorConn struct{ c net.Conn }

// startFloorCluster starts the floor's three replicas, their files kept
// (BenchmarkFloorKept) or written over in a circle (BenchmarkFloor).
func startFloorCluster(tb testing.TB, kept bool) *floorCluster {
	tb.Helper()
	// The directories first: cleanups run last-registered first, and the
	// files are closed before their directories are removed.
	dirs := []string{tb.TempDir(), tb.TempDir(), tb.TempDir()}
	c := &floorCluster{wake: make(chan struct{}, 1)}
	files := make([]*floorFile, 3)
	tb.Cleanup(func() {
		if err := c.close(nil); err != nil {
			tb.Errorf("floor cluster: %v", err)
		}
		// Only now: the goroutines that write the files have returned.
		for _, f := range files {
			if f != nil {
				f.f.Close()
			}
		}
	})
	for i := range files {
		f, err := newFloorFile(dirs[i], kept)
		if err != nil {
			tb.Fatalf("floor replica %d: %v", i, err)
		}
		f.syncs = &c.syncs
		files[i] = f
	}
	for i := 1; i <= 2; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		c.track(l)
		conn, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			tb.Fatal(err)
		}
		c.track(conn)
		fconn, err := l.Accept()
		if err != nil {
			tb.Fatal(err)
		}
		c.track(fconn)
		c.followers = append(c.followers, conn)
		c.goFail(func() error { return runFloorFollower(fconn, files[i]) })
		c.goFail(func() error { return c.readAcks(conn, i) })
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	c.track(l)
	c.leaderAddr = l.Addr().String()
	c.goFail(func() error { return c.sync(files[0]) })
	c.goFail(func() error {
		for {
			conn, err := l.Accept()
			if err != nil {
				return err
			}
			c.track(conn)
			c.goFail(func() error { return c.serveClient(&floorConn{c: conn}) })
		}
	})
	return c
}

// track registers x to be closed when the cluster closes.
func (c *floorCluster) track(x io.Closer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		x.Close()
		return
	}
	c.closers = append(c.closers, x)
}

// goFail runs fn on a goroutine of the cluster; its error, unless the
// cluster is closing, fails the cluster.
func (c *floorCluster) goFail(fn func() error) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		if err := fn(); err != nil {
			c.close(err)
		}
	}()
}

// close records cause (nil on an orderly close) as the cluster's failure
// unless it is already closed, closes everything, and on the orderly close
// waits for its goroutines and returns the failure, if any.
func (c *floorCluster) close(cause error) error {
	c.mu.Lock()
	if !c.closed {
		c.closed, c.err = true, cause
		for _, x := range c.closers {
			x.Close()
		}
		close(c.wake)
	}
	err := c.err
	c.mu.Unlock()
	if cause == nil {
		c.wg.Wait()
	}
	return err
}

// serveClient reads a client's calls and accepts each: forwarded to both
// followers and handed to the leader's syncer, in the order of acceptance.
func (c *floorCluster) serveClient(conn *floorConn) error {
	r := bufio.NewReaderSize(conn.c, 64<<10)
	var hdr [12]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return nil // the client is gone
		}
		n := binary.BigEndian.Uint32(hdr[:4])
		frame := make([]byte, 4+n) // the length prefix, as followers read it
		binary.BigEndian.PutUint32(frame, n)
		if _, err := io.ReadFull(r, frame[4:]); err != nil {
			return nil
		}
		if err := c.accept(conn, binary.BigEndian.Uint64(hdr[4:]), frame); err != nil {
			return err
		}
	}
}

func (c *floorCluster) accept(conn *floorConn, id uint64, frame []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	// Forwarding under the mutex keeps every follower's copy in the
	// leader's order.
	for _, f := range c.followers {
		if _, err := f.Write(frame); err != nil {
			return fmt.Errorf("forward to a follower: %w", err)
		}
	}
	c.end += uint64(len(frame) - 4)
	c.waiting = append(c.waiting, floorCall{end: c.end, id: id, conn: conn})
	c.pending = append(c.pending, frame[4:]...)
	select {
	case c.wake <- struct{}{}:
	default:
	}
	return nil
}

// sync is the leader's syncer: it writes and fdatasyncs whatever was
// accepted since its last pass, then counts it durable on the leader.
func (c *floorCluster) sync(f *floorFile) error {
	var buf []byte
	for range c.wake {
		c.mu.Lock()
		buf, c.pending = c.pending, buf[:0]
		end := c.end
		c.mu.Unlock()
		if len(buf) == 0 {
			continue
		}
		if err := f.write(buf); err != nil {
			return fmt.Errorf("leader: %w", err)
		}
		c.durable0(end)
	}
	return nil
}

func (c *floorCluster) durable0(end uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.durable[0] = end
	c.commitLocked()
}

// readAcks reads follower i's durable ends.
func (c *floorCluster) readAcks(conn net.Conn, i int) error {
	r := bufio.NewReader(conn)
	var b [8]byte
	for {
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return c.closingOr(fmt.Errorf("acks of follower %d: %w", i, err))
		}
		c.mu.Lock()
		c.durable[i] = binary.BigEndian.Uint64(b[:])
		c.commitLocked()
		c.mu.Unlock()
	}
}

// closingOr returns nil if the cluster is closing, else err.
func (c *floorCluster) closingOr(err error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	return err
}

// commitLocked acknowledges every waiting call that two of the three
// replicas hold durably.
func (c *floorCluster) commitLocked() {
	d := c.durable
	// The quorum's end is the middle of the three durable ends: the
	// largest that at least two of them reach.
	quorum := max(min(d[0], d[1]), min(d[0], d[2]), min(d[1], d[2]))
	n := 0
	for _, w := range c.waiting {
		if w.end > quorum {
			break
		}
		var ack [8]byte
		binary.BigEndian.PutUint64(ack[:], w.id)
		// A failed write leaves that client's call unanswered; the
		// client sees its connection end.
		_, _ = w.conn.c.Write(ack[:])
		n++
	}
	c.waiting = c.waiting[n:]
}

// runFloorFollower writes what the leader forwards, every frame already
// read in one pass (group commit), and answers its durable end after each
// fdatasync.
func runFloorFollower(conn net.Conn, f *floorFile) error {
	r := bufio.NewReaderSize(conn, 1<<20)
	var end uint64
	var buf []byte
	var hdr [4]byte
	for {
		buf = buf[:0]
		for len(buf) == 0 || r.Buffered() >= 4 {
			if _, err := io.ReadFull(r, hdr[:]); err != nil {
				return nil // the leader is gone
			}
			n := int(binary.BigEndian.Uint32(hdr[:]))
			buf = append(buf, make([]byte, n)...)
			if _, err := io.ReadFull(r, buf[len(buf)-n:]); err != nil {
				return nil
			}
		}
		if err := f.write(buf); err != nil {
			return fmt.Errorf("follower: %w", err)
		}
		end += uint64(len(buf))
		var ack [8]byte
		binary.BigEndian.PutUint64(ack[:], end)
		if _, err := conn.Write(ack[:]); err != nil {
			return nil
		}
	}
}

// newAppender connects one client to the leader.
func (c *floorCluster) newAppender(int) (Appender, error) {
	conn, err := net.Dial("tcp", c.leaderAddr)
	if err != nil {
		return nil, err
	}
	a := &floorAppender{conn: conn, calls: map[uint64]chan struct{}{}, done: make(chan struct{})}
	go a.readAcks()
	return a, nil
}

// floorAppender is a client of the floor cluster, safe for concurrent use.
type floorAppender struct {
	conn net.Conn
	done chan struct{} // closed when the connection ends

	mu    sync.Mutex
	next  uint64
	calls map[uint64]chan struct{}
	buf   []byte
}

func (a *floorAppender) Append(ctx context.Context, records [][]byte) error {
	ack := make(chan struct{})
	a.mu.Lock()
	a.next++
	id := a.next
	a.calls[id] = ack
	n := 0
	for _, r := range records {
		n += len(r)
	}
	a.buf = binary.BigEndian.AppendUint32(a.buf[:0], uint32(n))
	a.buf = binary.BigEndian.AppendUint64(a.buf, id)
	for _, r := range records {
		a.buf = append(a.buf, r...)
	}
	_, err := a.conn.Write(a.buf)
	a.mu.Unlock()
	if err != nil {
		return err
	}
	select {
	case <-ack:
		return nil
	case <-a.done:
		return errors.New("floor: connection to the leader ended")
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (a *floorAppender) readAcks() {
	defer close(a.done)
	r := bufio.NewReader(a.conn)
	var b [8]byte
	for {
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return
		}
		id := binary.BigEndian.Uint64(b[:])
		a.mu.Lock()
		ack := a.calls[id]
		delete(a.calls, id)
		a.mu.Unlock()
		if ack != nil {
			close(ack)
		}
	}
}

func (a *floorAppender) Close() error {
	err := a.conn.Close()
	<-a.done
	return err
}
