package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// bench --disk: what each replica of the range holds on disk while the
// bench appends, from GetStatus. A replica reports its data directory's
// bytes on disk in DiskStatus.used_bytes (allocated blocks: segments, WAL,
// Badger, journals); one that does not (an older replica) answers 0 there,
// and only the range's stored bytes tell then.

// diskSample is one round of GetStatus calls, one per member.
type diskSample struct {
	at       time.Time
	replicas []diskOf
}

// diskOf is one member's answer.
type diskOf struct {
	id     string
	used   uint64 // DiskStatus.used_bytes; 0: not reported
	stored uint64 // the range's stored_bytes on the replica
	err    error
}

// describe is the sample for a progress line: "r1 45.2MiB (range 9.1MiB), ...".
func (s diskSample) describe() string {
	if len(s.replicas) == 0 {
		return "not sampled yet"
	}
	parts := make([]string, len(s.replicas))
	for i, d := range s.replicas {
		switch {
		case d.err != nil:
			parts[i] = d.id + " " + shortErr(d.err)
		case d.used == 0:
			parts[i] = fmt.Sprintf("%s - (range %s)", d.id, formatBytes(d.stored))
		default:
			parts[i] = fmt.Sprintf("%s %s (range %s)", d.id, formatBytes(d.used), formatBytes(d.stored))
		}
	}
	return strings.Join(parts, ", ")
}

// diskSampler samples the members of a range every interval until stopped.
type diskSampler struct {
	c       *clients
	members []*tenurev1.Replica
	rangeID string
	done    chan struct{}
	wg      sync.WaitGroup
	once    sync.Once

	mu      sync.Mutex
	samples []diskSample
}

func startDiskSampler(ctx context.Context, c *clients, r *tenurev1.RangeInfo, every time.Duration) *diskSampler {
	s := &diskSampler{c: c, members: r.GetReplicas(), rangeID: r.GetRangeId(), done: make(chan struct{})}
	s.sample(ctx)
	s.wg.Go(func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-s.done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				s.sample(ctx)
			}
		}
	})
	return s
}

// sample asks every member at once, each call bounded by rpcTimeout.
func (s *diskSampler) sample(ctx context.Context) {
	out := diskSample{at: time.Now(), replicas: make([]diskOf, len(s.members))}
	var wg sync.WaitGroup
	for i, m := range s.members {
		out.replicas[i].id = m.GetId()
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, rpcTimeout)
			defer cancel()
			resp, err := s.c.replica(m.GetAddress()).GetStatus(cctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: s.rangeID}))
			d := &out.replicas[i]
			switch {
			case err != nil:
				d.err = err
			case len(resp.Msg.GetRanges()) != 1:
				d.err = fmt.Errorf("does not host range %s", s.rangeID)
			default:
				d.used, d.stored = resp.Msg.GetDisk().GetUsedBytes(), resp.Msg.GetRanges()[0].GetStoredBytes()
			}
		})
	}
	wg.Wait()
	s.mu.Lock()
	s.samples = append(s.samples, out)
	s.mu.Unlock()
}

// last is the latest sample.
func (s *diskSampler) last() diskSample {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.samples) == 0 {
		return diskSample{}
	}
	return s.samples[len(s.samples)-1]
}

// stop ends the sampling with a last sample, the first time it is called,
// and returns every sample in time order.
func (s *diskSampler) stop() []diskSample {
	s.once.Do(func() {
		close(s.done)
		s.wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
		defer cancel()
		s.sample(ctx)
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.samples
}

// benchDiskJSON is bench --json's "disk": every sample and each member's
// peaks.
type benchDiskJSON struct {
	EveryMs float64               `json:"every_ms"`
	Peaks   []benchDiskPeakJSON   `json:"peaks"`
	Samples []benchDiskSampleJSON `json:"samples"`
}

// benchDiskPeakJSON is a member's largest sample of each kind.
type benchDiskPeakJSON struct {
	ID string `json:"replica_id"`
	// UsedBytes is the peak of DiskStatus.used_bytes: 0 when the replica
	// never reported it.
	UsedBytes   uint64 `json:"used_bytes"`
	StoredBytes uint64 `json:"stored_bytes"`
	// Samples counts the samples it answered.
	Samples int `json:"samples"`
}

type benchDiskSampleJSON struct {
	// TMs is when the sample was taken, from the start of the appends
	// (negative: before them).
	TMs      float64           `json:"t_ms"`
	Replicas []benchDiskOfJSON `json:"replicas"`
}

type benchDiskOfJSON struct {
	ID          string `json:"replica_id"`
	UsedBytes   uint64 `json:"used_bytes"`
	StoredBytes uint64 `json:"stored_bytes"`
	Error       string `json:"error,omitempty"`
}

// diskJSON summarizes samples, taken every every, against the start of the
// appends.
func diskJSON(samples []diskSample, every time.Duration, start time.Time) *benchDiskJSON {
	out := &benchDiskJSON{EveryMs: ms(every), Peaks: []benchDiskPeakJSON{}, Samples: []benchDiskSampleJSON{}}
	peakOf := map[string]int{} // index in out.Peaks
	for _, s := range samples {
		js := benchDiskSampleJSON{TMs: ms(s.at.Sub(start)), Replicas: make([]benchDiskOfJSON, len(s.replicas))}
		for i, d := range s.replicas {
			js.Replicas[i] = benchDiskOfJSON{ID: d.id, UsedBytes: d.used, StoredBytes: d.stored}
			k, ok := peakOf[d.id]
			if !ok {
				k = len(out.Peaks)
				peakOf[d.id] = k
				out.Peaks = append(out.Peaks, benchDiskPeakJSON{ID: d.id})
			}
			p := &out.Peaks[k]
			if d.err != nil {
				js.Replicas[i].Error = d.err.Error()
				continue
			}
			p.UsedBytes, p.StoredBytes = max(p.UsedBytes, d.used), max(p.StoredBytes, d.stored)
			p.Samples++
		}
		out.Samples = append(out.Samples, js)
	}
	return out
}

// writeDiskPeaks prints each member's peaks as a table.
func writeDiskPeaks(w io.Writer, d *benchDiskJSON) error {
	fmt.Fprintf(w, "disk, peak of %d samples every %v (USED: the replica's data directory on disk; STORED: the range's batches on it):\n",
		len(d.Samples), time.Duration(d.EveryMs*float64(time.Millisecond)))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "REPLICA\tPEAK USED\tPEAK STORED\tSAMPLES")
	for _, p := range d.Peaks {
		used := "-"
		if p.UsedBytes > 0 {
			used = formatBytes(p.UsedBytes)
		}
		stored := "-"
		if p.Samples > 0 {
			stored = formatBytes(p.StoredBytes)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\n", p.ID, used, stored, p.Samples)
	}
	return tw.Flush()
}
