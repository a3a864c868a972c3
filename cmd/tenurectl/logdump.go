package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"unicode/utf8"

	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/services/replica/logstore"
)

const logDumpHelp = `
Print everything a replica stores for one range, read offline from its data
directory: every record, committed or not, with its offset, epoch and value;
the log end, the high-water mark, the fenced epoch, the role and leader it
knew, and its epoch history (the journal).

No RPC returns this: reads serve only a leader's committed records. It is
what chaos checkers compare across replicas, and what an operator looks at
after a replica misbehaved.

The directory must not be in use: stop the replica first, or better, copy
its data directory (docker cp CONTAINER:/data DIR) and dump the copy.
Opening the store recovers it exactly as a replica restart would: a torn,
unsynced log tail is cut, a pending truncation is finished, and a missing or
corrupt journal is rebuilt from the records' epochs; warnings about any of
that go to stderr. So the dump shows what the replica would serve after a
restart, and the directory may be changed by that recovery.
`

func runLogDump(_ context.Context, e *env, args []string) error {
	flags := newFlags(e, "log dump", "--data-dir DIR --range RANGE [--json]", logDumpHelp)
	dataDir := flags.String("data-dir", "", "the replica's data directory (holds badger/ and journal/); required")
	rangeID := flags.String("range", "", "the range to dump; required")
	asJSON := flags.Bool("json", e.global.json, "print one JSON object instead of a table")
	positional, err := parseArgs(flags, args)
	if err != nil {
		return err
	}
	if len(positional) != 0 {
		return usagef("unexpected arguments %q (the directory and range are flags)", positional)
	}
	if *dataDir == "" || *rangeID == "" {
		return usagef("--data-dir and --range are required")
	}
	// logstore.Open creates a missing store: check first, so a mistyped
	// path is an error rather than a new, empty store.
	if _, err := os.Stat(filepath.Join(*dataDir, "badger")); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s holds no replica store (no badger/ directory): give the replica's data directory", *dataDir)
		}
		return err
	}
	d, err := dumpRange(*dataDir, *rangeID, slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(e.stdout, d)
	}
	return writeLogDumpText(e.stdout, d)
}

// logDumpJSON is the dump's JSON form. Offsets and epochs are plain JSON
// numbers (they stay far below 2^53); values are base64, as encoding/json
// writes []byte.
type logDumpJSON struct {
	DataDir       string           `json:"data_dir"`
	Range         string           `json:"range_id"`
	LogStart      uint64           `json:"log_start"`
	LogEnd        uint64           `json:"log_end"`
	HighWaterMark uint64           `json:"high_water_mark"`
	FencedEpoch   uint64           `json:"fenced_epoch"`
	Epoch         uint64           `json:"epoch"`
	Role          string           `json:"role"`
	LeaderID      string           `json:"leader_id"`
	History       []epochStartJSON `json:"history"`
	Records       []logRecordJSON  `json:"records"`
	Replicas      []logReplicaJSON `json:"replicas"`
	Ranges        []string         `json:"ranges_in_store"`
}

type epochStartJSON struct {
	Epoch uint64 `json:"epoch"`
	Start uint64 `json:"start"`
}

type logRecordJSON struct {
	Offset     uint64 `json:"offset"`
	Epoch      uint64 `json:"epoch"`
	EpochStart bool   `json:"epoch_start"`
	Committed  bool   `json:"committed"`
	// Value and ValueBase64 are as in consume --json: the value as text,
	// or, when it is not UTF-8, base64 in value_base64 (value empty).
	Value       string `json:"value"`
	ValueBase64 []byte `json:"value_base64,omitempty"`
}

type logReplicaJSON struct {
	ID      string `json:"id"`
	Address string `json:"address"`
}

// dumpRange opens the store in dir, reads range id whole and closes it.
func dumpRange(dir, id string, log *slog.Logger) (*logDumpJSON, error) {
	s, err := logstore.Open(dir, logstore.Options{Logger: log})
	if err != nil {
		return nil, fmt.Errorf("open the store in %s (is the replica still running? stop it or dump a copy): %w", dir, err)
	}
	d, derr := readRange(s, dir, id)
	if cerr := s.Close(); cerr != nil && derr == nil {
		derr = cerr
	}
	return d, derr
}

func readRange(s *logstore.Store, dir, id string) (*logDumpJSON, error) {
	ids := s.RangeIDs()
	r, ok := s.Range(id)
	if !ok {
		return nil, fmt.Errorf("the store in %s holds no range %q (it holds: %s)", dir, id, orDash(strings.Join(ids, ", ")))
	}
	st := r.State()
	d := &logDumpJSON{
		DataDir: dir, Range: id, LogStart: r.LogStart(), LogEnd: r.LogEnd(), HighWaterMark: r.HWM(),
		FencedEpoch: st.FencedEpoch, Epoch: st.Epoch, Role: roleName(st.Role), LeaderID: st.LeaderID,
		History: []epochStartJSON{}, Records: []logRecordJSON{}, Replicas: []logReplicaJSON{}, Ranges: ids,
	}
	for _, h := range r.History() {
		d.History = append(d.History, epochStartJSON{Epoch: h.Epoch, Start: h.Start})
	}
	for _, rep := range st.Replicas {
		d.Replicas = append(d.Replicas, logReplicaJSON{ID: rep.GetId(), Address: rep.GetAddress()})
	}
	// Read in pages: Read returns at most wire.MaxReadRecords records and
	// wire.MaxBatchBytes of values per call, and always at least one.
	for from := d.LogStart; from < d.LogEnd; {
		recs, err := r.Read(from, wire.MaxReadRecords, 0)
		if err != nil {
			return nil, fmt.Errorf("read range %s at %d: %w", id, from, err)
		}
		if len(recs) == 0 {
			return nil, fmt.Errorf("read range %s at %d: no records below the log end %d", id, from, d.LogEnd)
		}
		for _, rec := range recs {
			d.Records = append(d.Records, recordOf(rec, d.HighWaterMark))
		}
		from = recs[len(recs)-1].GetOffset() + 1
	}
	return d, nil
}

func recordOf(rec *tenurev1.Record, hwm uint64) logRecordJSON {
	r := logRecordJSON{Offset: rec.GetOffset(), Epoch: rec.GetEpoch(), EpochStart: rec.GetEpochStart(),
		Committed: rec.GetOffset() < hwm, Value: string(rec.GetValue())}
	if !utf8.Valid(rec.GetValue()) {
		r.Value, r.ValueBase64 = "", rec.GetValue()
	}
	return r
}

func writeLogDumpText(w io.Writer, d *logDumpJSON) error {
	var hist []string
	for _, h := range d.History {
		hist = append(hist, fmt.Sprintf("(%d, %d)", h.Epoch, h.Start))
	}
	history := strings.Join(hist, " ")
	if len(hist) == 0 {
		history = "none (unknown, or complete if the log is empty)"
	}
	leader := orDash(d.LeaderID)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "range\t%s\n", d.Range)
	fmt.Fprintf(tw, "data dir\t%s\n", d.DataDir)
	fmt.Fprintf(tw, "role\t%s at epoch %d (fenced at %d), leader %s\n", d.Role, d.Epoch, d.FencedEpoch, leader)
	fmt.Fprintf(tw, "log\t[%d, %d), HWM %d (%d uncommitted)\n", d.LogStart, d.LogEnd, d.HighWaterMark, d.LogEnd-min(d.LogEnd, d.HighWaterMark))
	fmt.Fprintf(tw, "epochs\t%s\n", history)
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(d.Records) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "OFFSET\tEPOCH\tCOMMITTED\tVALUE\n")
	for _, r := range d.Records {
		v := fmt.Sprintf("%q", r.Value)
		if r.ValueBase64 != nil {
			v = fmt.Sprintf("%q", r.ValueBase64)
		}
		if r.EpochStart {
			v = "(epoch start)"
		} else if len(v) > 64 {
			v = v[:60] + "...\""
		}
		fmt.Fprintf(tw, "%d\t%d\t%t\t%s\n", r.Offset, r.Epoch, r.Committed, v)
	}
	return tw.Flush()
}
