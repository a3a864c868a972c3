package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"connectrpc.com/connect"
	"golang.org/x/term"

	"github.com/tenurelog/tenure/pkg/transport"
	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// leaderWait is how long produce and consume wait for a range to have a
// serving leader (a promotion in progress) before giving up.
const leaderWait = 10 * time.Second

const produceHelp = `
Append records to a range and print the offset each was acknowledged at,
one line a record on stdout (--echo prints OFFSET<TAB>VALUE); the range,
leader and epoch that took them go to stderr. The values are the arguments, or, with
none, stdin: one record per line (without its newline, or split at
--delimiter instead), sent in batches of --batch records; with --binary the
whole of stdin is one record. At a terminal each line is sent as it is
typed; Ctrl-D ends.

The leader is found by asking the lease service for the range's replicas and
each replica for its status; a replica that answers it no longer leads names
the leader, and produce follows it there. An append is acknowledged once a
quorum of replicas holds it durably: an acknowledged record is never lost.

Appends are idempotent: produce names its records with a random producer id
and a sequence, and an append whose outcome is unknown (a timeout, a leader
killed or deposed mid-append) is sent again, to the range's leader then, for
up to --retry-for; the leader writes each record at most once, and answers a
retry of records it holds with their original offsets. If produce still
fails, the failed append's outcome is unknown (it may yet commit under a
later leader): consume the range before producing it again. Unless every
try was refused before anything was written (a full disk, a certificate
without the producer role): the error then says "Nothing of them was
written". A full leader's refusal is retried for --retry-for too, since
space may come back, and produce says so on stderr once.
A leader whose dedupe window no longer holds produce's earlier records
(retention removed them while stdin was quiet) refuses the next batch
before writing it: produce then goes on under a new producer id.
--no-idempotence sends plain appends (for a server older than idempotent
producers, which would ignore the producer fields). A plain append that may
have been written is never sent again; one refused by a replica that does
not lead wrote nothing, so it is sent again, to the leader, for up to
--retry-for.
`

func runProduce(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "produce", "RANGE [VALUE...] [--delimiter STRING | --binary] [--echo]", produceHelp)
	o := addClusterFlags(e, fs)
	batch := fs.Int("batch", 100, fmt.Sprintf("stdin records per append (1-%d)", wire.MaxBatchRecords))
	delimiter := fs.String("delimiter", `\n`, "what separates stdin's records: a `STRING`, Go escapes allowed ('\\0', '\\t', ',', '---\\n')")
	binary := fs.Bool("binary", false, "the whole of stdin is one record, bytes as they are (an empty stdin is one empty record)")
	echo := fs.Bool("echo", false, "print each record's value after its offset")
	retryFor := new(30 * time.Second)
	fs.Var(durationFlag{d: retryFor, zeroOK: true}, "retry-for", "how long to retry an append whose outcome is unknown (0: never)")
	plain := fs.Bool("no-idempotence", false, "send plain appends, without producer id and sequence, and never retry one that may have been written")
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
	// \0 is how people write NUL (find -print0); Go spells it \x00.
	delim, err := strconv.Unquote(`"` + nulEscape.ReplaceAllString(strings.ReplaceAll(*delimiter, `"`, `\"`), `\x00$1`) + `"`)
	switch {
	case err != nil:
		return usagef("--delimiter %q: not a valid escape (Go escapes such as \\n, \\t, \\0 are allowed)", *delimiter)
	case delim == "":
		return usagef("--delimiter %q: want a non-empty string", *delimiter)
	}
	rangeID, values := positional[0], positional[1:]
	if len(values) > 0 && *binary {
		return usagef("--binary reads one record from stdin; give values or --binary, not both")
	}
	if *binary && setFlag(fs, "delimiter") {
		return usagef("--binary reads the whole of stdin as one record: it has no --delimiter")
	}
	c := newClients(o)
	defer c.close()
	leader, _, err := c.findLeader(ctx, rangeID, leaderWait)
	if err != nil {
		return err
	}
	p := &producer{c: c, e: e, rangeID: rangeID, leader: leader, json: *o.json, echo: *echo, retryFor: *retryFor}
	if !*plain {
		p.id = newProducerID()
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
	if *binary {
		v, err := io.ReadAll(io.LimitReader(e.stdin, wire.MaxRecordBytes+1))
		switch {
		case err != nil:
			return fmt.Errorf("reading the record from stdin: %w", err)
		case len(v) > wire.MaxRecordBytes:
			return fmt.Errorf("stdin is longer than a record may be (%d bytes)", wire.MaxRecordBytes)
		}
		if err := p.append(ctx, [][]byte{v}); err != nil {
			return err
		}
		return p.finish()
	}
	if terminal(e.stdin) {
		// Someone is typing: each record goes as it is entered, not
		// once --batch of them are.
		*batch = 1
		fmt.Fprintf(e.stderr, "tenurectl produce: one record per line to range %s; Ctrl-D ends\n", rangeID)
	}
	sc := bufio.NewScanner(e.stdin)
	sc.Buffer(make([]byte, 64<<10), wire.MaxRecordBytes+len(delim)+1)
	if delim != "\n" {
		sc.Split(splitAt([]byte(delim)))
	}
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
			err = fmt.Errorf("a record is longer than a record may be (%d bytes)", wire.MaxRecordBytes)
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

// nulEscape is \0 not followed by another octal digit (\012 stays octal).
var nulEscape = regexp.MustCompile(`\\0([^0-7]|$)`)

// setFlag says whether the command line set the flag.
func setFlag(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// terminal says whether r is a terminal (someone typing), not a pipe, a
// file or /dev/null (a character device too, hence x/term, not Stat).
func terminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// splitAt is a bufio.SplitFunc for records separated by delim. Like lines,
// a delimiter at the very end does not start an empty last record.
func splitAt(delim []byte) bufio.SplitFunc {
	return func(data []byte, atEOF bool) (int, []byte, error) {
		if i := bytes.Index(data, delim); i >= 0 {
			return i + len(delim), data[:i], nil
		}
		if atEOF && len(data) > 0 {
			return len(data), data, nil
		}
		return 0, nil, nil
	}
}

// newProducerID is a random producer id: 128 random bits never collide in
// practice (docs/idempotence.md).
func newProducerID() []byte {
	id := make([]byte, 16)
	_, _ = rand.Read(id) // never fails (Go 1.24)
	return id
}

type producer struct {
	c       *clients
	e       *env
	rangeID string
	leader  *tenurev1.Replica
	json    bool
	echo    bool
	// id is the producer id (nil: plain appends) and seq the next
	// sequence; retryFor bounds the retries of one append.
	id       []byte
	seq      uint64
	retryFor time.Duration

	count int
}

// producedJSON is one acknowledged record of produce --json, a line each
// as they are acknowledged; the value only with --echo.
type producedJSON struct {
	RangeID  string  `json:"range_id"`
	Offset   uint64  `json:"offset"`
	Epoch    uint64  `json:"epoch"`
	LeaderID string  `json:"leader_id"`
	Value    *string `json:"value,omitempty"`
}

func (p *producer) append(ctx context.Context, values [][]byte) error {
	req := &tenurev1.AppendRequest{RangeId: p.rangeID, Records: values, ProducerId: p.id, FirstSequence: p.seq}
	var resp *connect.Response[tenurev1.AppendResponse]
	var err error
	deadline := time.Now().Add(p.retryFor)
	follows := 0
	// mayBeWritten: some attempt failed in a way that may have written
	// the batch (a timeout, a broken connection, a leader deposed while
	// it waited for the quorum). Until one does, every failure was a
	// refusal before any offset was assigned, and the final error says
	// so rather than "outcome unknown".
	mayBeWritten, toldFull, renewed := false, false, false
	for pause := 100 * time.Millisecond; ; {
		cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		resp, err = p.c.log(p.leader.GetAddress()).Append(cctx, connect.NewRequest(req))
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil || !refusedUnwritten(err) {
			mayBeWritten = true
		}
		if ctx.Err() != nil {
			break
		}
		// The leader's dedupe window no longer holds this producer's
		// records (retention removed them while stdin was quiet, or 2^20
		// offsets were appended since): it cannot check the sequence, and
		// wrote nothing. No try of this batch may have been written, and
		// every earlier batch was acknowledged, so it goes again from a
		// new producer at sequence 0 (as pkg/appender does). A produce
		// reading a quiet stdin used to stop here.
		if connect.CodeOf(err) == connect.CodeOutOfRange && p.id != nil && !mayBeWritten && !renewed {
			renewed = true
			p.id = newProducerID()
			p.seq = 0
			req.ProducerId, req.FirstSequence = p.id, 0
			continue
		}
		// Leadership moved since the leader was found: the refusal names
		// the new one (and wrote nothing, so even a plain append may go
		// again), so the batch goes there at once, bounded.
		if follows < maxRedirects {
			if next := redirect(p.e, "produce", err, p.leader); next != nil {
				follows++
				p.leader = next
				continue
			}
		}
		// A not-leader refusal wrote nothing whether or not it names a
		// leader (a replica fenced by a promotion still running knows
		// none yet): even a plain append goes again, once one leads.
		refused := wire.NotLeader(err) != nil
		if (p.id == nil && !refused) || !retryable(err) || time.Now().Add(pause).After(deadline) {
			break
		}
		if connect.CodeOf(err) == connect.CodeResourceExhausted && !toldFull {
			// Retried in silence this would look like a hang: the disk
			// may take the whole --retry-for to come back.
			toldFull = true
			if p.e.stderr != nil {
				fmt.Fprintf(p.e.stderr, "tenurectl produce: %s refused the append: %s; nothing was written; trying again for up to --retry-for %v\n",
					p.leader.GetId(), connectMessage(err), p.retryFor)
			}
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
		pause = min(2*pause, time.Second)
	}
	if err != nil {
		done := ""
		if p.count > 0 {
			done = fmt.Sprintf(" (the %s before them were acknowledged)", plural(p.count, "record"))
		}
		if connect.CodeOf(err) == connect.CodeInvalidArgument {
			return fmt.Errorf("the leader refused the batch of %s: %s%s", plural(len(values), "record"), connectMessage(err), done)
		}
		if wire.NotLeader(err) != nil {
			return fmt.Errorf("append of %s refused by %s at %s, which does not lead range %s: %s%s.\nNothing of them was written; no serving leader took them within --retry-for %v: 'tenurectl status %s' shows why",
				plural(len(values), "record"), p.leader.GetId(), p.leader.GetAddress(), p.rangeID, connectMessage(err), done, p.retryFor, p.rangeID)
		}
		if !mayBeWritten {
			return fmt.Errorf("append of %s refused by leader %s at %s: %v%s.\nNothing of them was written: producing them again cannot duplicate them",
				plural(len(values), "record"), p.leader.GetId(), p.leader.GetAddress(), err, done)
		}
		return fmt.Errorf("append of %s to leader %s at %s failed: %v%s.\nTheir outcome is unknown: they may still commit under a later leader; 'tenurectl consume %s' shows what did before you produce them again",
			plural(len(values), "record"), p.leader.GetId(), p.leader.GetAddress(), err, done, p.rangeID)
	}
	p.seq += uint64(len(values))
	m := resp.Msg
	if p.count == 0 && !p.json {
		// Context for whoever watches, on stderr: stdout is the offsets
		// alone, one line a record, for a script to read (it used to
		// begin with this line, which every reader had to skip).
		fmt.Fprintf(p.e.stderr, "range %s, leader %s, epoch %d:\n", p.rangeID, p.leader.GetId(), m.GetEpoch())
	}
	enc := json.NewEncoder(p.e.stdout)
	for i, v := range values {
		off := m.GetBaseOffset() + uint64(i)
		if p.json {
			rec := producedJSON{RangeID: p.rangeID, Offset: off, Epoch: m.GetEpoch(), LeaderID: p.leader.GetId()}
			if p.echo {
				value := string(v)
				rec.Value = &value
			}
			_ = enc.Encode(rec)
			continue
		}
		if p.echo {
			fmt.Fprintf(p.e.stdout, "%d\t%s\n", off, printable(v))
			continue
		}
		fmt.Fprintf(p.e.stdout, "%d\n", off)
	}
	p.count += len(values)
	return nil
}

// refusedUnwritten says whether an append that failed with err certainly
// wrote nothing: it never reached a replica (the dial failed), or the
// replica refused it before assigning offsets: not the leader, a malformed
// batch, a certificate without the producer role, no such range here, a
// full disk (README "A full disk": refused before offsets are assigned).
// Not FailedPrecondition in general: a leader that lost its lease or was
// deposed while waiting for the quorum answers it after writing.
func refusedUnwritten(err error) bool {
	if wire.NotLeader(err) != nil || isDialError(err) {
		return true
	}
	switch connect.CodeOf(err) {
	case connect.CodeInvalidArgument, connect.CodePermissionDenied, connect.CodeUnauthenticated,
		connect.CodeNotFound, connect.CodeResourceExhausted,
		// An append's OutOfRange is the dedupe window's refusal, made
		// before any offset is assigned.
		connect.CodeOutOfRange:
		return true
	}
	return false
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

func (p *producer) finish() error { return nil }

const consumeHelp = `
Print a range's committed records from its leader, one per line as
OFFSET<TAB>VALUE (a value holding a tab, newline or non-printable byte, or
beginning with '"', is printed Go-quoted, so one line is one record), from --from (default 0) up to the high-water mark. With
--follow, keep printing records as they commit, following the range across
leader changes, until Ctrl-C (or --limit records); a --from beyond the
high-water mark then waits for that offset to commit (without --follow it
is an error: only committed records are read).

Records below the range's log start were deleted by retention (see range
create --retention-bytes/--retention-age). A --from below the log start is
an error that names the log start; --from-start reads from wherever the log
starts now (with --follow too), and if retention moves the start past the
next record while consume runs, it skips to the new start and says so on
stderr.

Each epoch begins with an epoch-start record that carries no data; consume
skips them (--epoch-starts shows them). With --json every record is one JSON
object per line.
`

func runConsume(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "consume", "RANGE [--from N | --from-start] [--follow] [--limit N]", consumeHelp)
	o := addClusterFlags(e, fs)
	from := fs.Uint64("from", 0, "first offset to read")
	fromStart := fs.Bool("from-start", false, "read from the range's log start (the lowest offset retention has kept); not with --from")
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
	if *fromStart && setFlag(fs, "from") {
		return usagef("--from and --from-start: give one")
	}
	c := newClients(o)
	defer c.close()
	cs := &consumer{e: e, rangeID: positional[0], next: *from, limit: *limit, json: *o.json, starts: *starts, fromStart: *fromStart}
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
	// fromStart: skip to the log start whenever next is below it
	// (--from-start), instead of failing.
	fromStart bool
}

// skipToLogStart moves next up to the log start a refusal named, when
// --from-start asked for that; false otherwise (the refusal is the answer).
func (cs *consumer) skipToLogStart(err error) bool {
	start, ok := wire.BelowLogStart(err)
	if !ok || !cs.fromStart || start <= cs.next {
		return false
	}
	if cs.e.stderr != nil && (cs.printed > 0 || cs.next > 0) {
		// Not said when --from-start merely found where the log begins.
		fmt.Fprintf(cs.e.stderr, "tenurectl consume: records from offset %d to %d were deleted by retention; continuing at the log start %d\n", cs.next, start, start)
	}
	cs.next = start
	return true
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
		if r.GetOffset() < cs.next {
			// Before --from: a follow from beyond the HWM tails from it.
			continue
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
			fmt.Fprintf(cs.e.stdout, "%d\t%s\n", r.GetOffset(), printable(r.GetValue()))
		}
	}
	return !(cs.limit > 0 && cs.printed >= cs.limit)
}

// readToEnd reads from the leader until the high-water mark.
//
// A leader can refuse reads for a moment: between a lapsed lease and its
// next (its keeper's renewal late on a loaded host), or before it has
// committed its epoch-start record (FailedPrecondition, "retry shortly"),
// or while it restarts (Unavailable). Reads change nothing, and cs.next
// says where the last one ended, so consume finds the leader again and
// reads on, within leaderWait, rather than fail on a blip.
func (cs *consumer) readToEnd(ctx context.Context, c *clients) error {
	deadline := time.Now().Add(leaderWait)
	for {
		leader, _, err := c.findLeader(ctx, cs.rangeID, time.Until(deadline))
		if err != nil {
			return err
		}
		err = cs.readFrom(ctx, c, leader)
		var blip notServing
		if !errors.As(err, &blip) || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// notServing is a read refused by a replica that may serve it shortly.
type notServing struct{ error }

// readFrom reads from leader until the high-water mark, following the
// leader a not-leader answer names (bounded).
func (cs *consumer) readFrom(ctx context.Context, c *clients, leader *tenurev1.Replica) error {
	lc := c.log(leader.GetAddress())
	follows := 0
	for {
		cctx, cancel := context.WithTimeout(ctx, rpcTimeout)
		resp, err := lc.Read(cctx, connect.NewRequest(&tenurev1.ReadRequest{RangeId: cs.rangeID, Offset: cs.next}))
		cancel()
		if err != nil {
			if cs.skipToLogStart(err) {
				continue
			}
			if next := redirect(cs.e, "consume", err, leader); next != nil && follows < maxRedirects {
				follows++
				leader, lc = next, c.log(next.GetAddress())
				continue
			}
			if code := connect.CodeOf(err); code == connect.CodeFailedPrecondition || code == connect.CodeUnavailable {
				return notServing{cs.readErr(err, leader)}
			}
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

// printable is a value as consume and produce --echo print it after
// OFFSET<TAB>: as it is when that cannot be misread, else Go-quoted
// (strconv.Quote), so that one line is always one record. Quoted are values
// holding a tab, newline or other control or non-printable character,
// invalid UTF-8, and values that begin with a double quote (so a quoted
// value is never mistaken for a raw one). --json gives the raw bytes.
func printable(v []byte) string {
	s := string(v)
	if !utf8.ValidString(s) || strings.HasPrefix(s, `"`) || strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) && r != ' ' }) >= 0 {
		return strconv.Quote(s)
	}
	return s
}

func (cs *consumer) readErr(err error, leader *tenurev1.Replica) error {
	if start, ok := wire.BelowLogStart(err); ok {
		return belowStartErr(err, start)
	}
	if connect.CodeOf(err) == connect.CodeOutOfRange {
		return fmt.Errorf("%s; consume reads committed records only: use a lower --from, or add --follow to wait for offset %d to commit", connectMessage(err), cs.next)
	}
	return fmt.Errorf("read from leader %s at %s: %v", leader.GetId(), leader.GetAddress(), err)
}

// belowStartErr is a read or tail refused below the log start: no wait
// brings those records back, so say where the log starts and how to read
// from there.
func belowStartErr(err error, start uint64) error {
	return fmt.Errorf("%s; consume from the log start with --from %d or --from-start", connectMessage(err), start)
}

// follow tails the range, finding the leader again whenever the stream
// ends (a leader change): committed offsets never change, so resuming at
// the next offset neither skips nor repeats a record.
func (cs *consumer) follow(ctx context.Context, c *clients) error {
	for ctx.Err() == nil {
		ls, err := c.findLeaderStatus(ctx, cs.rangeID, 30*time.Second)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		leader := ls.replica
		// The leader tails committed records only, from at most its HWM: a
		// follow from beyond it starts the tail at the HWM and print skips
		// what comes before --from, so it waits for that offset to commit.
		// The HWM only rises, so the leader accepts the offset it reported.
		if start := ls.status.GetLogStart(); cs.fromStart && cs.next < start {
			// The status names the log start already: no refused tail
			// needed to find it.
			cs.next = start
		}
		from := cs.next
		if hwm := ls.status.GetHighWaterMark(); from > hwm {
			from = hwm
		}
		stream, err := c.log(leader.GetAddress()).Tail(ctx, connect.NewRequest(&tenurev1.TailRequest{RangeId: cs.rangeID, Offset: from}))
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
		if cs.skipToLogStart(err) {
			continue
		}
		if start, ok := wire.BelowLogStart(err); ok {
			return fmt.Errorf("tail from leader %s at offset %d: %w", leader.GetId(), from, belowStartErr(err, start))
		}
		if connect.CodeOf(err) == connect.CodeOutOfRange {
			// Below the log start: no wait brings those records back.
			return fmt.Errorf("tail from leader %s at offset %d: %s", leader.GetId(), from, connectMessage(err))
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
