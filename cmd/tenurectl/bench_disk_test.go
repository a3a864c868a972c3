package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// bench --duration runs for a time rather than a count, with --records as
// a cap; --disk samples each replica's disk and the range's stored bytes
// while it runs, in the progress lines, the report's peaks and --json's
// samples. On a range with a small retention, the peaks stay far below
// what the run wrote.
func testBenchDuration(t *testing.T, c *testCluster) {
	out := c.mustCtl("", "range", "create", "soak", "--replicas", c.members(), "--retention-bytes", "64KiB")
	wantLines(t, "range create", out, "created range soak", "retention 64KiB or 7d")
	leader := c.waitLeader("soak", 1)

	// --records caps a --duration run.
	out = c.mustCtl("", "bench", "soak", "--duration", "1m", "--records", "12", "--batch", "4")
	wantLines(t, "bench --duration 1m --records 12", out,
		"bench range soak, leader "+leader+" at epoch 1: for 1m0s (at most 12 records), records of 100 bytes, batches of 4",
		"acknowledged 12 records in")

	code, stdout, stderr := c.ctl("", "bench", "soak", "--duration", "3s", "--disk", "--size", "1024", "--batch", "16", "--concurrency", "4")
	if code != exitOK {
		t.Fatalf("bench --duration 3s --disk: status %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	wantLines(t, "bench --duration 3s --disk", stdout,
		"bench range soak, leader "+leader+" at epoch 1: for 3s, records of 1024 bytes, batches of 16, 4 concurrent appenders",
		"acknowledged",
		"append latency: p50",
		"disk, peak of",
		"REPLICA PEAK USED PEAK STORED SAMPLES",
		"r1 ", "r2 ", "r3 ")
	// A progress line (every 2 s) with the last sample of each replica.
	wantLines(t, "bench --duration 3s --disk progress", stderr, "records acknowledged in 2s of 3s")
	if !strings.Contains(stderr, "; disk r1 ") || !strings.Contains(stderr, "(range ") {
		t.Errorf("the progress line gives no disk sample of r1 and the range's stored bytes:\n%s", stderr)
	}

	out = c.mustCtl("", "bench", "soak", "--duration", "2s", "--disk", "--size", "1024", "--batch", "16", "--json")
	var res benchJSON
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Disk == nil {
		t.Fatalf("bench --duration 2s --disk --json = %s (%v), want a disk object", out, err)
	}
	// A sample before the appends, one every 500ms, one after: at least 4
	// in 2 s, each answered by all three replicas.
	if len(res.Disk.Samples) < 4 || len(res.Disk.Peaks) != 3 || res.Disk.EveryMs != 500 {
		t.Fatalf("bench --json disk: %d samples every %vms, %d peaks; want at least 4, every 500ms, 3 peaks:\n%s", len(res.Disk.Samples), res.Disk.EveryMs, len(res.Disk.Peaks), out)
	}
	for _, s := range res.Disk.Samples {
		for _, r := range s.Replicas {
			if r.Error != "" {
				t.Errorf("sample at %vms: %s answered %q", s.TMs, r.ID, r.Error)
			}
		}
	}
	written := uint64(res.Records) * 1024
	for _, p := range res.Disk.Peaks {
		if p.Samples != len(res.Disk.Samples) || p.StoredBytes == 0 {
			t.Errorf("peak of %s: %d samples, stored %d bytes; want every sample answered, some bytes stored", p.ID, p.Samples, p.StoredBytes)
		}
		// Retention (64 KiB, applied early from 1 MiB past it) keeps the
		// range from holding what was written, once that is several
		// times what a pass leaves behind.
		if written > 16<<20 && p.StoredBytes > written/2 {
			t.Errorf("%s stored up to %d bytes of the %d written: retention did not hold the range near 64 KiB", p.ID, p.StoredBytes, written)
		}
	}

	code, _, stderr = c.ctl("", "bench", "soak", "--duration", "-1s")
	if code != exitUsage || !strings.Contains(stderr, "--duration -1s") {
		t.Errorf("bench --duration -1s: status %d, stderr:\n%s\nwant a usage error naming --duration", code, stderr)
	}
}
