package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"text/tabwriter"

	"github.com/tenurelog/tenure/pkg/journal"
)

const journalDumpHelp = `
Print an epoch journal file: its header, each entry (the epoch and the offset
of its first record in the replica's log, and where that epoch's stretch of
the log ends), and whether its tail is torn or fails its checksum.

The file is only read. A torn or checksum-failed final entry is what an
interrupted append leaves; a replica cuts it when it next opens the journal,
and dump reports what would be cut without cutting it. Damage anywhere else
makes the journal corrupt: dump says where it is and fails (status 1), and a
replica rebuilds such a journal from its own log when it next starts (every
stored record carries its epoch), or quarantines the range if its log cannot
settle it.
`

func runJournalDump(_ context.Context, e *env, args []string) error {
	flags := newFlags(e, "journal dump", "[--json] PATH", journalDumpHelp)
	asJSON := flags.Bool("json", e.global.json, "print one JSON object instead of a table")
	positional, err := parseArgs(flags, args)
	if err != nil {
		return err
	}
	if len(positional) != 1 {
		return usagef("want exactly one journal PATH, got %d arguments", len(positional))
	}
	path := positional[0]

	in, err := journal.Inspect(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("no journal at %s: check the path (a replica keeps one journal file per range in its data directory)", path)
	case errors.Is(err, journal.ErrCorrupt):
		// What the replica does with it (logstore recover.go): the
		// operator has nothing to repair by hand, only a copy to keep.
		return fmt.Errorf("%w\n"+
			"When the replica next starts it rebuilds this journal from its own log\n"+
			"(every stored record carries its epoch) and logs \"rebuilt the epoch journal\n"+
			"from the log\"; if the log cannot settle the history, the range is\n"+
			"quarantined instead (tenurectl status: HALTED, quarantined) and\n"+
			"'tenurectl range rebuild RANGE --replica ID' restores it from its peers.\n"+
			"Nothing to repair by hand: copy the file first if you want it for diagnosis,\n"+
			"since the rebuild replaces it.", err)
	case err != nil:
		return err
	}
	if *asJSON {
		return writeDumpJSON(e.stdout, path, in)
	}
	return writeDumpText(e.stdout, path, in)
}

// tailState is the dump's name for what Open would repair.
func tailState(r journal.Repair) (token, text string) {
	switch r {
	case journal.RepairNone:
		return "clean", "clean"
	case journal.RepairHeader:
		return "no_header", "no complete header (a crash while the file was created); opening the journal writes it"
	case journal.RepairTorn:
		return "torn", "torn: a partial final entry (an interrupted append); opening the journal cuts it"
	case journal.RepairChecksum:
		return "bad_checksum", "final entry fails its checksum (an interrupted append); opening the journal cuts it"
	}
	return r.String(), r.String()
}

func writeDumpText(w io.Writer, path string, in journal.Inspection) error {
	_, tail := tailState(in.Repair)
	if in.CutBytes > 0 {
		tail = fmt.Sprintf("%s\n\t%d bytes at offset %d would be cut", tail, in.CutBytes, in.Size-int64(in.CutBytes))
	}
	format := "none"
	if in.Version != 0 {
		format = fmt.Sprintf("TNRJRNL version %d", in.Version)
	}
	history := fmt.Sprintf("%d of at most %d", len(in.Entries), journal.MaxEntries)
	if len(in.Entries) == 0 {
		history = "none (the replica's epoch history is unknown)"
	}

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "journal\t%s\n", path)
	fmt.Fprintf(tw, "size\t%d bytes\n", in.Size)
	fmt.Fprintf(tw, "header\t%s\n", format)
	fmt.Fprintf(tw, "entries\t%s\n", history)
	fmt.Fprintf(tw, "tail\t%s\n", tail)
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(in.Entries) == 0 {
		return nil
	}

	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "INDEX\tEPOCH\tSTART\tEND\t\n")
	for i, es := range in.Entries {
		// An epoch's stretch runs to the next epoch's start; the last one's
		// runs to the log end, which only the replica's log knows.
		end := "log end"
		if i+1 < len(in.Entries) {
			end = fmt.Sprint(in.Entries[i+1].Start)
		}
		fmt.Fprintf(tw, "%d\t%d\t%d\t%s\t\n", i, es.Epoch, es.Start, end)
	}
	return tw.Flush()
}

type dumpJSON struct {
	Path       string      `json:"path"`
	SizeBytes  int64       `json:"size_bytes"`
	Version    int         `json:"version"`
	MaxEntries int         `json:"max_entries"`
	Entries    []entryJSON `json:"entries"`
	// Tail is clean, torn, bad_checksum or no_header.
	Tail     string `json:"tail"`
	CutBytes int    `json:"cut_bytes"`
}

type entryJSON struct {
	Index int    `json:"index"`
	Epoch uint64 `json:"epoch"`
	Start uint64 `json:"start"`
}

func writeDumpJSON(w io.Writer, path string, in journal.Inspection) error {
	tail, _ := tailState(in.Repair)
	out := dumpJSON{
		Path:       path,
		SizeBytes:  in.Size,
		Version:    int(in.Version),
		MaxEntries: journal.MaxEntries,
		Entries:    []entryJSON{},
		Tail:       tail,
		CutBytes:   in.CutBytes,
	}
	for i, e := range in.Entries {
		out.Entries = append(out.Entries, entryJSON{Index: i, Epoch: e.Epoch, Start: e.Start})
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}
