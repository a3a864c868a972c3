package journal_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/tenurelog/tenure/pkg/journal"
	"github.com/tenurelog/tenure/pkg/journal/journaltest"
)

// BenchmarkRecord measures one durable Record on the real filesystem, and
// counts the fsyncs each costs through the FS seam: the design pays exactly
// one per new epoch, and this metric catches a change that pays more.
func BenchmarkRecord(b *testing.B) {
	path := filepath.Join(b.TempDir(), "r1.journal")
	fsys := journaltest.NewFaultFS(journal.OSFS{})
	open := func() *journal.Journal {
		j, err := journal.OpenFS(fsys, path)
		if err != nil {
			b.Fatal(err)
		}
		return j
	}
	j := open()
	var syncs, records int64
	for i := 0; b.Loop(); i++ {
		n := i % journal.MaxEntries
		if n == 0 && i > 0 {
			// The journal is full: start a fresh one, off the clock.
			b.StopTimer()
			if err := j.Close(); err != nil {
				b.Fatal(err)
			}
			if err := os.Remove(path); err != nil {
				b.Fatal(err)
			}
			j = open()
			b.StartTimer()
		}
		before := fsys.Syncs()
		if err := j.Record(uint64(n+1), uint64(n)*100); err != nil {
			b.Fatal(err)
		}
		syncs += fsys.Syncs() - before
		records++
	}
	b.ReportMetric(float64(syncs)/float64(records), "fsyncs/op")
	if err := j.Close(); err != nil {
		b.Fatal(err)
	}
}
