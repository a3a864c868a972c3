package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// The ready line: once a server serves, it prints one JSON object on a line
// of its own on stdout (its logs go to stderr, so stdout carries nothing
// else) and, with --ready-file, writes the same line to that file,
// atomically (a temp file in the same directory, synced, then renamed over
// the path): an orchestrator or a test waits for the line or the file
// instead of polling a port, and learns the bound address even with
// --listen on port 0. The fields are part of the interface:
//
//	{"ready":true,"service":"replica","id":"r1","address":"http://127.0.0.1:7101","pid":123}
//
// service is lease, replica, promoter (or, from tenure dev --json, etcd);
// id is the server's id (none for the lease service and etcd); address is
// the URL it serves on; pid the process that serves it; metrics its
// Prometheus metrics URL, when it serves them.
type readyLine struct {
	Ready   bool   `json:"ready"`
	Service string `json:"service"`
	ID      string `json:"id,omitempty"`
	Address string `json:"address"`
	PID     int    `json:"pid"`
	// Metrics is the server's Prometheus metrics URL (--metrics-listen),
	// absent when it serves none.
	Metrics string `json:"metrics,omitempty"`
}

// readyHelp is the servers' --help paragraph about the ready line.
const readyHelp = `
Once it serves, it prints one line on stdout (logs go to stderr), a JSON
object such as {"ready":true,"service":"replica","id":"r1",
"address":"http://127.0.0.1:7101","pid":123}, and with --ready-file writes
the same line to that file atomically: wait for either instead of polling
its port. The file is removed again on a clean stop.
`

// readyFileFlag defines --ready-file on a server's flag set.
func readyFileFlag(fs *flag.FlagSet) *string {
	return fs.String("ready-file", "", "once serving, also write the ready line (the JSON object printed on stdout) to this file, atomically (temp file and rename); removed again on a clean stop")
}

// clearReadyFile removes a ready file left by an earlier run, before this
// one serves: a waiter must not take the old one for this run's.
func clearReadyFile(path string) error {
	if path == "" {
		return nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("--ready-file: remove the one left by an earlier run: %w", err)
	}
	return nil
}

// announceReady writes l as one line to path atomically, if path is set,
// and then prints it on w.
func announceReady(w io.Writer, path string, l readyLine) error {
	b, err := json.Marshal(l)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	// The file first: whoever saw the line on stdout finds the file too.
	if path != "" {
		if err := writeFileAtomic(path, b); err != nil {
			return fmt.Errorf("--ready-file: %w", err)
		}
	}
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("print the ready line: %w", err)
	}
	return nil
}

// writeFileAtomic writes b to path so that a reader sees either no file or
// all of b: a temp file beside it, synced, renamed over it.
func writeFileAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
	}
	return err
}

// removeReadyFile removes this run's ready file on a clean stop: the
// server no longer serves.
func removeReadyFile(path string) {
	if path != "" {
		_ = os.Remove(path)
	}
}
