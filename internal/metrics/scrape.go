package metrics

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// scrapeMaxBytes bounds what Scrape reads: a replica at RangeSeriesMax
// ranges exports well under a megabyte.
const scrapeMaxBytes = 16 << 20

// Samples are one scrape's samples, by series as the text format prints
// it: name{label="value",...} with the labels in the exporter's order
// (client_golang sorts them by name), or the bare name.
type Samples map[string]float64

// Get returns the sample of series (e.g.
// `tenure_replica_ranges{role="leader"}`) and whether it was exported.
func (s Samples) Get(series string) (float64, bool) {
	v, ok := s[series]
	return v, ok
}

// Sum adds every sample of metric name, whatever its labels.
func (s Samples) Sum(name string) float64 {
	var t float64
	for k, v := range s {
		if k == name || strings.HasPrefix(k, name+"{") {
			t += v
		}
	}
	return t
}

// Scrape reads url's metrics in Prometheus' text format.
func Scrape(ctx context.Context, client *http.Client, url string) (Samples, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	// The text format, never protobuf: Parse reads text.
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: %s", url, resp.Status)
	}
	return Parse(io.LimitReader(resp.Body, scrapeMaxBytes))
}

// Parse reads samples in Prometheus' text format: every line that is not
// a comment is a series, a space and a value (client_golang writes no
// timestamps).
func Parse(r io.Reader) (Samples, error) {
	out := Samples{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			return nil, fmt.Errorf("metrics: no value in line %q", line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics: line %q: %w", line, err)
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}
