package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"

	"github.com/tenurelog/tenure/pkg/transport"
	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// leaderWait is how long produce and consume wait for a range to have a
// serving leader (a promotion in progress) before giving up.
const leaderWait = 10 * time.Second

const produceHelp = `
Append records to a range and print the offset each was acknowledged at. The
values are the arguments, or, with none, the lines of stdin (without their
newline), sent in batches of --batch lines.

The leader is found by asking the lease service for the range's replicas and
each replica for its status. An append is acknowledged once a quorum of
replicas holds it durably: an acknowledged record is never lost.

Appends are idempotent: produce names its records with a random producer id
and a sequence, and an append whose outcome is unknown (a timeout, a leader
killed or deposed mid-append) is sent again, to the range's leader then, for
up to --retry-for; the leader writes each record at most once, and answers a
retry of records it holds with their original offsets. If produce still
fails, the failed append's outcome is unknown (it may yet commit under a
later leader): consume the range before producing it again.
--no-idempotence sends plain appends, never retried (for a server older than
idempotent producers, which would ignore the producer fields).
`

func runProduce(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "produce", "RANGE [VALUE...]", produceHelp)
	o := addClusterFlags(e, fs)
	batch := fs.Int("batch", 100, fmt.Sprintf("stdin lines per append (1-%d)", wire.MaxBatchRecords))
	retryFor := fs.Duration("retry-for", 30*time.Second, "how long to retry an append whose outcome is unknown (0: never)")
	plain := fs.Bool("no-idempotence", false, "send plain appends, without producer id and sequence, and never retry them")
	positional, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(positional) < 1 {
		return usagef("want a RANGE and then values (or values on stdin)")
	}
	if *batch < 1 || *batch > wire.MaxBatchRecords {
		return usagef("--batch %d: want 1 to %d", *batch, wire.MaxBatchRecords)
	}
	rangeID, values := positional[0], positional[1:]
	c := newClients(o)
	defer c.close()
	leader, _, err := c.findLeader(ctx, rangeID, leaderWait)
	if err != nil {
		return err
	}
	p := &producer{c: c, e: e, rangeID: rangeID, leader: leader, json: *o.json, retryFor: *retryFor}
	if !*plain {
		p.id = make([]byte, 16)
		_, _ = rand.Read(p.id) // never fails (Go 1.24)
	}
	if len(values) > 0 {
		batch := make([][]byte, len(values))
		for i, v := range values {
			batch[i] = []byte(v)
		}
		if err := p.append(ctx, batch); err != nil {
			return err
		}
		return p.finish()
	}
	sc := bufio.NewScanner(e.stdin)
	sc.Buffer(make([]byte, 64<<10), wire.MaxRecordBytes+1)
	var pending [][]byte
	size := 0
	for sc.Scan() {
		line := sc.Bytes()
		if size+len(line) > wire.MaxBatchBytes && len(pending) > 0 {
			if err := p.append(ctx, pending); err != nil {
				return err
			}
			pending, size = nil, 0
		}
		pending = append(pending, append([]byte(nil), line...))
		size += len(line)
		if len(pending) == *batch {
			if err := p.append(ctx, pending); err != nil {
				return err
			}
			pending, size = nil, 0
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			err = fmt.Errorf("a line is longer than a record may be (%d bytes)", wire.MaxRecordBytes)
		}
		return fmt.Errorf("reading records from stdin after %s: %w", plural(p.count, "acknowledged record"), err)
	}
	if len(pending) > 0 {
		if err := p.append(ctx, pending); err != nil {
			return err
		}
	}
	if p.count == 0 {
		return usagef("no values given and stdin was empty: nothing to produce")
	}
	return p.finish()
}

type producer struct {
	c       *clients
	e       *env
	rangeID string
	leader  *tenurev1.Replica
	json    bool
	// id is the producer id (nil: plain appends) and seq the next
	// sequence; retryFor bounds the retries of one append.
	id       []byte
	seq      uint64
	retryFor time.Duration

	count   int
	records []producedJSON
}

type producedJSON struct {
	Offset uint64 `json:"offset"`
	Epoch  uint64 `json:"epoch"`
	Value  string `json:"value"`
}

func (p *producer) append(ctx context.Context, values [][]byte) error {
	req := &tenurev1.AppendRequest{RangeId: p.rangeID, Records: values, ProducerId: p.id, FirstSequence: p.seq}
	var resp *connect.Response[tenurev1.AppendResponse]
	var err error
	deadline := time.Now().Add(p.retryFor)
	for pause := 100 * time.Millisecond; ; pause = min(2*pause, time.Second) {
		cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		resp, err = p.c.log(p.leader.GetAddress()).Append(cctx, connect.NewRequest(req))
		cancel()
		if err == nil || p.id == nil || !retryable(err) || ctx.Err() != nil || time.Now().Add(pause).After(deadline) {
			break
		}
		// The same sequence again, to whoever leads now: the leader
		// writes it once, or answers where it already is.
		select {
		case <-ctx.Done():
		case <-time.After(pause):
		}
		if l, _, ferr := p.c.findLeader(ctx, p.rangeID, time.Until(deadline)); ferr == nil {
			p.leader = l
		}
	}
	if err != nil {
		done := ""
		if p.count > 0 {
			done = fmt.Sprintf(" (the %s before them were acknowledged)", plural(p.count, "record"))
		}
		if connect.CodeOf(err) == connect.CodeInvalidArgument {
			return fmt.Errorf("the leader refused the batch of %s: %s%s", plural(len(values), "record"), connectMessage(err), done)
		}
		return fmt.Errorf("append of %s to leader %s at %s failed: %v%s.\nTheir outcome is unknown: they may still commit under a later leader; 'tenurectl consume %s' shows what did before you produce them again",
			plural(len(values), "record"), p.leader.GetId(), p.leader.GetAddress(), err, done, p.rangeID)
	}
	p.seq += uint64(len(values))
	m := resp.Msg
	if p.count == 0 && !p.json {
		fmt.Fprintf(p.e.stdout, "range %s, leader %s, epoch %d:\n", p.rangeID, p.leader.GetId(), m.GetEpoch())
	}
	for i, v := range values {
		off := m.GetBaseOffset() + uint64(i)
		if p.json {
			p.records = append(p.records, producedJSON{Offset: off, Epoch: m.GetEpoch(), Value: string(v)})
			continue
		}
		fmt.Fprintf(p.e.stdout, "%d\t%s\n", off, v)
	}
	p.count += len(values)
	return nil
}

// retryable says whether an idempotent append that failed with err is worth
// sending again: anything but a refusal of the request itself (malformed,
// no such range, a sequence outside the dedupe window, denied).
func retryable(err error) bool {
	switch connect.CodeOf(err) {
	case connect.CodeInvalidArgument, connect.CodeOutOfRange, connect.CodePermissionDenied,
		connect.CodeUnauthenticated, connect.CodeDataLoss:
		return false
	}
	return true
}

func (p *producer) finish() error {
	if p.json {
		return writeJSON(p.e.stdout, map[string]any{"range": p.rangeID, "leader": p.leader.GetId(), "records": p.records})
	}
	return nil
}

const consumeHelp = `
Print a range's committed records from its leader, one per line as
OFFSET<TAB>VALUE, from --from (default 0) up to the high-water mark. With
--follow, keep printing records as they commit, following the range across
leader changes, until Ctrl-C (or --limit records).

Each epoch begins with an epoch-start record that carries no data; consume
skips them (--epoch-starts shows them). With --json every record is one JSON
object per line.
`

func runConsume(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "consume", "RANGE [--from N] [--follow] [--limit N]", consumeHelp)
	o := addClusterFlags(e, fs)
	from := fs.Uint64("from", 0, "first offset to read")
	follow := fs.Bool("follow", false, "keep reading as records commit, until Ctrl-C")
	limit := fs.Int("limit", 0, "stop after this many records (0: no limit)")
	starts := fs.Bool("epoch-starts", false, "also print the epoch-start records")
	positional, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(positional) != 1 {
		return usagef("want exactly one RANGE, got %d arguments", len(positional))
	}
	if *limit < 0 {
		return usagef("--limit %d: want 0 (no limit) or more", *limit)
	}
	c := newClients(o)
	defer c.close()
	cs := &consumer{e: e, rangeID: positional[0], next: *from, limit: *limit, json: *o.json, starts: *starts}
	if *follow {
		return cs.follow(ctx, c)
	}
	return cs.readToEnd(ctx, c)
}

type consumer struct {
	e       *env
	rangeID string
	next    uint64 // the next offset to print
	limit   int
	printed int
	json    bool
	starts  bool
}

type recordJSON struct {
	Offset      uint64 `json:"offset"`
	Epoch       uint64 `json:"epoch"`
	Value       string `json:"value"`
	ValueBase64 []byte `json:"value_base64,omitempty"`
	EpochStart  bool   `json:"epoch_start,omitempty"`
}

// print prints records in order; false once the limit is reached.
func (cs *consumer) print(recs []*tenurev1.Record) bool {
	enc := json.NewEncoder(cs.e.stdout)
	for _, r := range recs {
		if cs.limit > 0 && cs.printed >= cs.limit {
			return false
		}
		cs.next = r.GetOffset() + 1
		if r.GetEpochStart() && !cs.starts {
			continue
		}
		cs.printed++
		switch {
		case cs.json:
			rj := recordJSON{Offset: r.GetOffset(), Epoch: r.GetEpoch(), Value: string(r.GetValue()), EpochStart: r.GetEpochStart()}
			if !utf8.Valid(r.GetValue()) {
				rj.Value, rj.ValueBase64 = "", r.GetValue()
			}
			_ = enc.Encode(rj)
		case r.GetEpochStart():
			fmt.Fprintf(cs.e.stdout, "%d\t<epoch %d starts>\n", r.GetOffset(), r.GetEpoch())
		default:
			fmt.Fprintf(cs.e.stdout, "%d\t%s\n", r.GetOffset(), r.GetValue())
		}
	}
	return !(cs.limit > 0 && cs.printed >= cs.limit)
}

// readToEnd reads from the leader until the high-water mark.
func (cs *consumer) readToEnd(ctx context.Context, c *clients) error {
	leader, _, err := c.findLeader(ctx, cs.rangeID, leaderWait)
	if err != nil {
		return err
	}
	lc := c.log(leader.GetAddress())
	for {
		cctx, cancel := context.WithTimeout(ctx, rpcTimeout)
		resp, err := lc.Read(cctx, connect.NewRequest(&tenurev1.ReadRequest{RangeId: cs.rangeID, Offset: cs.next}))
		cancel()
		if err != nil {
			return cs.readErr(err, leader)
		}
		if len(resp.Msg.GetRecords()) == 0 {
			if !cs.json && cs.printed == 0 && cs.e.stderr != nil {
				fmt.Fprintf(cs.e.stderr, "no records from offset %d (high-water mark %d); --follow waits for new ones\n", cs.next, resp.Msg.GetHighWaterMark())
			}
			return nil
		}
		if !cs.print(resp.Msg.GetRecords()) {
			return nil
		}
	}
}

func (cs *consumer) readErr(err error, leader *tenurev1.Replica) error {
	if connect.CodeOf(err) == connect.CodeOutOfRange {
		return fmt.Errorf("%s; consume reads committed records only: use a lower --from, or --follow to wait for it", connectMessage(err))
	}
	return fmt.Errorf("read from leader %s at %s: %v", leader.GetId(), leader.GetAddress(), err)
}

// follow tails the range, finding the leader again whenever the stream
// ends (a leader change): committed offsets never change, so resuming at
// the next offset neither skips nor repeats a record.
func (cs *consumer) follow(ctx context.Context, c *clients) error {
	for ctx.Err() == nil {
		leader, _, err := c.findLeader(ctx, cs.rangeID, 30*time.Second)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		stream, err := c.log(leader.GetAddress()).Tail(ctx, connect.NewRequest(&tenurev1.TailRequest{RangeId: cs.rangeID, Offset: cs.next}))
		if err == nil {
			for stream.Receive() {
				if !cs.print(stream.Msg().GetRecords()) {
					stream.Close()
					return nil
				}
			}
			// A leader that crashed or was cut off ends the stream
			// mid-body: say it was lost, not "internal: protocol error".
			err = transport.LostStream(stream.Err())
			stream.Close()
		}
		if ctx.Err() != nil {
			return nil
		}
		if connect.CodeOf(err) == connect.CodeOutOfRange {
			return cs.readErr(err, leader)
		}
		fmt.Fprintf(cs.e.stderr, "tenurectl consume: the stream from %s ended (%v); finding the leader again from offset %d\n", leader.GetId(), shortErrOrEOF(err), cs.next)
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
	return nil
}

func shortErrOrEOF(err error) string {
	if err == nil || errors.Is(err, io.EOF) {
		return "closed by the server"
	}
	return shortErr(err)
}
