package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tenurelog/tenure/pkg/transport"
)

const traceHelp = `
Fetch a trace from Jaeger's query API and draw it as a waterfall: one line
per span, indented under its parent, with its start offset from the trace's
first span, its duration, a timeline bar, the service (and instance) that
recorded it and its key attributes (tenure.* attributes, the peer of a
client call, errors).

A promotion is one trace: the promoter's "promote" span with the epoch
grant, each fence, the candidate choice (every replica's log end, HWM and
last epoch; the committed bound; the candidate), each truncation and each
adoption, and under each call the span of the replica or lease service that
answered it. The trace id is in the transition record ('tenurectl
transitions', 'tenurectl promote') and in the promoter's log.

The last line links the same trace in Jaeger's UI (--jaeger-ui, by
default the --jaeger URL: the UI and the query API share a port; 'make ctl'
points it at the stack's published port, http://127.0.0.1:16686).

Processes export spans in batches, so a trace can take a second or two to
appear, and a process that was killed may never send its last spans.
`

// defaultJaegerURL is where the compose file publishes Jaeger's query API.
const defaultJaegerURL = "http://127.0.0.1:16686"

const (
	// traceFetchTimeout bounds the Jaeger query.
	traceFetchTimeout = 10 * time.Second
	// traceMaxBytes bounds the response read: a promotion's trace is tens
	// of spans, a few hundred KiB at the very most; anything far larger is
	// not a trace this command can usefully draw.
	traceMaxBytes = 32 << 20
	// traceBarWidth is the timeline's width in characters.
	traceBarWidth = 32
)

func runTrace(ctx context.Context, e *env, args []string) error {
	flags := newFlags(e, "trace", "[--jaeger URL] [--jaeger-ui URL] [--json] TRACE_ID", traceHelp)
	jaegerDefault := defaultJaegerURL
	if v := e.getenv("TENURECTL_JAEGER"); v != "" {
		jaegerDefault = v
	}
	jaeger := flags.String("jaeger", jaegerDefault, "Jaeger query base `URL`, or HOST:PORT (env TENURECTL_JAEGER)")
	jaegerUI := flags.String("jaeger-ui", e.getenv("TENURECTL_JAEGER_UI"), "Jaeger UI base `URL` for the trace's link, when a browser reaches Jaeger elsewhere than --jaeger (default: --jaeger; env TENURECTL_JAEGER_UI)")
	asJSON := flags.Bool("json", e.global.json, "print the waterfall's rows as JSON instead of drawing it")
	positional, err := parseArgs(flags, args)
	if err != nil {
		return err
	}
	if len(positional) != 1 {
		return usagef("want exactly one TRACE_ID, got %d arguments", len(positional))
	}
	id := strings.ToLower(strings.TrimSpace(positional[0]))
	if _, err := hex.DecodeString(id); err != nil || (len(id) != 32 && len(id) != 16) {
		return usagef("trace id %q: want 32 hex digits (as in a transition record)", positional[0])
	}

	uiFlag, uiBase := "--jaeger-ui", *jaegerUI
	if uiBase == "" {
		uiFlag, uiBase = "--jaeger", *jaeger
	}
	ui, err := transport.BaseURL(uiBase, false)
	if err != nil {
		return usagef("%s: %v", uiFlag, err)
	}
	t, err := fetchJaegerTrace(ctx, *jaeger, id)
	if err != nil {
		return err
	}
	w := buildWaterfall(t)
	// The single-page app's route for one trace: Jaeger serves its UI for
	// every path that is not the API's or a static file's.
	w.UIURL = ui + "/trace/" + id
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(w)
	}
	return w.draw(e.stdout)
}

// jaegerResponse is the part of Jaeger's GET /api/traces/{id} answer this
// command reads.
type jaegerResponse struct {
	Data   []jaegerTrace `json:"data"`
	Errors []struct {
		Code int    `json:"code"`
		Msg  string `json:"msg"`
	} `json:"errors"`
}

type jaegerTrace struct {
	TraceID   string                   `json:"traceID"`
	Spans     []jaegerSpan             `json:"spans"`
	Processes map[string]jaegerProcess `json:"processes"`
}

type jaegerSpan struct {
	TraceID       string `json:"traceID"`
	SpanID        string `json:"spanID"`
	OperationName string `json:"operationName"`
	References    []struct {
		RefType string `json:"refType"`
		TraceID string `json:"traceID"`
		SpanID  string `json:"spanID"`
	} `json:"references"`
	StartTime int64       `json:"startTime"` // µs since the Unix epoch
	Duration  int64       `json:"duration"`  // µs
	Tags      []jaegerTag `json:"tags"`
	ProcessID string      `json:"processID"`
}

type jaegerTag struct {
	Key   string `json:"key"`
	Value any    `json:"value"`
}

type jaegerProcess struct {
	ServiceName string      `json:"serviceName"`
	Tags        []jaegerTag `json:"tags"`
}

func fetchJaegerTrace(ctx context.Context, base, id string) (*jaegerTrace, error) {
	// Jaeger is not a tenure server: tenurectl's TLS identity is not used
	// with it, so HOST:PORT means http:// here.
	base, err := transport.BaseURL(base, false)
	if err != nil {
		return nil, usagef("--jaeger: %v", err)
	}
	u, err := url.Parse(base + "/api/traces/" + id)
	if err != nil {
		return nil, usagef("--jaeger: %v", err)
	}
	ctx, cancel := context.WithTimeout(ctx, traceFetchTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return nil, fmt.Errorf("cannot reach Jaeger at %s (%v): is it running? Point --jaeger or TENURECTL_JAEGER at its query API", base, op.Err)
		}
		return nil, fmt.Errorf("query Jaeger at %s: %w", base, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, traceMaxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read Jaeger's answer: %w", err)
	}
	if len(body) > traceMaxBytes {
		return nil, fmt.Errorf("Jaeger's answer for trace %s exceeds %d MiB; not drawing it", id, traceMaxBytes>>20)
	}
	var jr jaegerResponse
	jsonErr := json.Unmarshal(body, &jr)
	if resp.StatusCode == http.StatusNotFound {
		if jsonErr != nil || len(jr.Errors) == 0 {
			// Jaeger's own 404 carries its error body; a server that is
			// not Jaeger's query API answers 404 for any path.
			return nil, fmt.Errorf("Jaeger's query API is not at %s (404 for %s, without Jaeger's error body): point --jaeger or TENURECTL_JAEGER at it", base, req.URL.Path)
		}
		return nil, fmt.Errorf("trace %s not found in Jaeger at %s: spans reach Jaeger a second or two after they end, and a Jaeger keeping traces in memory loses them when it restarts", id, base)
	}
	if jsonErr != nil {
		return nil, fmt.Errorf("Jaeger at %s answered %s, not a trace: %w", base, resp.Status, jsonErr)
	}
	if resp.StatusCode != http.StatusOK {
		msg := resp.Status
		if len(jr.Errors) > 0 {
			msg = jr.Errors[0].Msg
		}
		return nil, fmt.Errorf("Jaeger at %s: %s", base, msg)
	}
	if len(jr.Data) == 0 || len(jr.Data[0].Spans) == 0 {
		return nil, fmt.Errorf("trace %s not found in Jaeger at %s (an empty answer)", id, base)
	}
	return &jr.Data[0], nil
}

// waterfall is a trace laid out for reading: spans in depth-first order,
// children by start time.
type waterfall struct {
	TraceID    string         `json:"trace_id"`
	DurationUs int64          `json:"duration_us"`
	UIURL      string         `json:"ui_url"` // the trace's page in Jaeger's UI
	Spans      []waterfallRow `json:"spans"`

	start int64 // µs since the epoch of the trace's first span
}

type waterfallRow struct {
	SpanID        string         `json:"span_id"`
	ParentID      string         `json:"parent_id,omitempty"`
	Depth         int            `json:"depth"`
	Name          string         `json:"name"`
	Kind          string         `json:"kind,omitempty"`
	Service       string         `json:"service"`
	Instance      string         `json:"instance,omitempty"`
	StartOffsetUs int64          `json:"start_offset_us"`
	DurationUs    int64          `json:"duration_us"`
	Error         string         `json:"error,omitempty"`
	Attributes    map[string]any `json:"attributes,omitempty"`

	// orphan: the span names a parent the trace does not hold (a process
	// that did not export it yet, or ever).
	orphan bool
	// cycle: the span's parents lead back to it; it is drawn as a root.
	cycle bool
	// attrs are the attributes in the order they were set, for drawing.
	attrs []jaegerTag
}

func tagValue(tags []jaegerTag, key string) (any, bool) {
	for _, t := range tags {
		if t.Key == key {
			return t.Value, true
		}
	}
	return nil, false
}

func tagString(tags []jaegerTag, key string) string {
	v, ok := tagValue(tags, key)
	if !ok {
		return ""
	}
	return fmt.Sprint(v)
}

func buildWaterfall(t *jaegerTrace) *waterfall {
	w := &waterfall{TraceID: t.TraceID}
	byID := map[string]*jaegerSpan{}
	end := int64(0)
	for i := range t.Spans {
		s := &t.Spans[i]
		byID[s.SpanID] = s
		if w.start == 0 || s.StartTime < w.start {
			w.start = s.StartTime
		}
		end = max(end, s.StartTime+s.Duration)
	}
	w.DurationUs = end - w.start

	parentOf := func(s *jaegerSpan) string {
		for _, r := range s.References {
			if r.RefType == "CHILD_OF" && (r.TraceID == "" || r.TraceID == s.TraceID) {
				return r.SpanID
			}
		}
		return ""
	}
	children := map[string][]*jaegerSpan{}
	var roots []*jaegerSpan
	for i := range t.Spans {
		s := &t.Spans[i]
		if p := parentOf(s); p != "" && byID[p] != nil {
			children[p] = append(children[p], s)
		} else {
			roots = append(roots, s)
		}
	}
	byStart := func(ss []*jaegerSpan) {
		sort.SliceStable(ss, func(i, j int) bool {
			if ss[i].StartTime != ss[j].StartTime {
				return ss[i].StartTime < ss[j].StartTime
			}
			return ss[i].SpanID < ss[j].SpanID
		})
	}
	byStart(roots)
	drawn := make(map[*jaegerSpan]bool, len(t.Spans))
	var walk func(s *jaegerSpan, depth int, cycle bool)
	walk = func(s *jaegerSpan, depth int, cycle bool) {
		drawn[s] = true
		row := w.row(t, s, parentOf(s), depth, byID)
		row.cycle = cycle
		w.Spans = append(w.Spans, row)
		kids := children[s.SpanID]
		byStart(kids)
		for _, k := range kids {
			if !drawn[k] {
				walk(k, depth+1, false)
			}
		}
	}
	for _, r := range roots {
		walk(r, 0, false)
	}
	// Spans whose parents lead round in a circle (two spans naming each
	// other, a span naming itself) are under no root: drawn from the
	// first of them to start, and marked, rather than left out of the
	// drawing and its count without a word.
	rest := make([]*jaegerSpan, 0, len(t.Spans)-len(w.Spans))
	for i := range t.Spans {
		if !drawn[&t.Spans[i]] {
			rest = append(rest, &t.Spans[i])
		}
	}
	byStart(rest)
	for _, s := range rest {
		if !drawn[s] {
			walk(s, 0, true)
		}
	}
	return w
}

// Tags every span has that say nothing about this span in particular.
var boringTags = map[string]bool{
	"span.kind": true, "otel.scope.name": true, "otel.scope.version": true,
	"otel.library.name": true, "otel.library.version": true, "internal.span.format": true,
	"otel.status_code": true, "otel.status_description": true, "error": true,
	"rpc.system.name": true, "rpc.system": true, "rpc.method": true, "rpc.service": true,
}

func (w *waterfall) row(t *jaegerTrace, s *jaegerSpan, parent string, depth int, byID map[string]*jaegerSpan) waterfallRow {
	proc := t.Processes[s.ProcessID]
	r := waterfallRow{
		SpanID:        s.SpanID,
		ParentID:      parent,
		Depth:         depth,
		Name:          s.OperationName,
		Service:       proc.ServiceName,
		Instance:      tagString(proc.Tags, "service.instance.id"),
		StartOffsetUs: s.StartTime - w.start,
		DurationUs:    s.Duration,
		orphan:        parent != "" && byID[parent] == nil,
	}
	if r.Service == "" {
		r.Service = "?"
	}
	if k := tagString(s.Tags, "span.kind"); k == "client" || k == "server" {
		r.Kind = k
	}
	if tagString(s.Tags, "otel.status_code") == "ERROR" || tagString(s.Tags, "error") == "true" {
		r.Error = tagString(s.Tags, "otel.status_description")
		if r.Error == "" {
			r.Error = "error"
		}
	}
	for _, tg := range s.Tags {
		if boringTags[tg.Key] {
			continue
		}
		if r.Attributes == nil {
			r.Attributes = map[string]any{}
		}
		r.Attributes[tg.Key] = tg.Value
		r.attrs = append(r.attrs, tg)
	}
	return r
}

// service is the process that recorded the span: the service name, and
// the instance (replica id) when the name does not already say it.
func (r *waterfallRow) service() string {
	if r.Instance == "" || strings.Contains(r.Service, r.Instance) {
		return r.Service
	}
	return r.Service + "/" + r.Instance
}

// keyAttributes renders the attributes worth reading on one line: tenure.*
// without the prefix, per-replica ones (tenure.r1.log_end) grouped as
// r1{log_end=.. hwm=..}, and the peer of a client call.
func (r *waterfallRow) keyAttributes() string {
	var parts []string
	groups := map[string]int{} // group name -> index in parts
	var groupKV [][]string
	for _, tg := range r.attrs {
		key, ok := strings.CutPrefix(tg.Key, "tenure.")
		if !ok {
			continue
		}
		val := fmt.Sprint(tg.Value)
		if strings.ContainsAny(val, " \t\n=\"") {
			val = strconv.Quote(val)
		}
		if g, k, grouped := cutLast(key, "."); grouped {
			i, seen := groups[g]
			if !seen {
				i = len(groupKV)
				groups[g] = i
				groupKV = append(groupKV, nil)
				parts = append(parts, "\x00"+g) // placeholder, filled below
			}
			groupKV[i] = append(groupKV[i], k+"="+val)
			continue
		}
		parts = append(parts, key+"="+val)
	}
	for i, p := range parts {
		if g, ok := strings.CutPrefix(p, "\x00"); ok {
			parts[i] = g + "{" + strings.Join(groupKV[groups[g]], " ") + "}"
		}
	}
	if r.Kind == "client" {
		if addr := r.attrString("server.address"); addr != "" {
			if port := r.attrString("server.port"); port != "" {
				addr = net.JoinHostPort(addr, port)
			}
			parts = append(parts, "→ "+addr)
		}
	}
	if r.orphan {
		parts = append(parts, "(parent span "+r.ParentID+" missing)")
	}
	if r.cycle {
		parts = append(parts, "(its parent spans form a cycle, from "+r.ParentID+")")
	}
	if r.Error != "" {
		parts = append(parts, "ERROR: "+r.Error)
	}
	return strings.Join(parts, " ")
}

func (r *waterfallRow) attrString(key string) string { return tagString(r.attrs, key) }

func cutLast(s, sep string) (before, after string, found bool) {
	if i := strings.LastIndex(s, sep); i >= 0 {
		return s[:i], s[i+len(sep):], true
	}
	return s, "", false
}

// bar draws [offset, offset+duration) on a timeline of the trace's length.
func (w *waterfall) bar(r *waterfallRow) string {
	total := max(w.DurationUs, 1)
	from := int(r.StartOffsetUs * traceBarWidth / total)
	to := int((r.StartOffsetUs + r.DurationUs) * traceBarWidth / total)
	from = min(from, traceBarWidth-1)
	to = max(min(to, traceBarWidth), from+1) // at least one cell: every span is visible
	return strings.Repeat(" ", from) + strings.Repeat("█", to-from) + strings.Repeat(" ", traceBarWidth-to)
}

func (w *waterfall) draw(out io.Writer) error {
	services := map[string]bool{}
	for i := range w.Spans {
		services[w.Spans[i].service()] = true
	}
	fmt.Fprintf(out, "trace %s: %s, %s, %s\n\n", w.TraceID, countOf(len(w.Spans), "span"), spanDuration(w.DurationUs), countOf(len(services), "service"))
	// tabwriter pads the last column too; trimmed lines diff cleanly.
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "%8s  %8s  %-*s\tSPAN\tSERVICE\tATTRIBUTES\n", "START", "DURATION", traceBarWidth+2, "TIMELINE")
	for i := range w.Spans {
		r := &w.Spans[i]
		name := strings.Repeat("  ", r.Depth) + r.Name
		if r.Kind != "" {
			name += " [" + r.Kind + "]"
		}
		fmt.Fprintf(tw, "%8s  %8s  |%s|\t%s\t%s\t%s\n", spanDuration(r.StartOffsetUs), spanDuration(r.DurationUs), w.bar(r), name, r.service(), r.keyAttributes())
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for line := range strings.Lines(buf.String()) {
		if _, err := io.WriteString(out, strings.TrimRight(line, " \n")+"\n"); err != nil {
			return err
		}
	}
	if w.UIURL != "" {
		if _, err := fmt.Fprintf(out, "\nin Jaeger's UI: %s\n", w.UIURL); err != nil {
			return err
		}
	}
	return nil
}

// spanDuration renders microseconds for reading: 3 significant digits or so.
func spanDuration(us int64) string {
	d := time.Duration(us) * time.Microsecond
	switch {
	case d >= time.Second:
		d = d.Round(time.Millisecond)
	case d >= 10*time.Millisecond:
		d = d.Round(100 * time.Microsecond)
	case d >= time.Millisecond:
		d = d.Round(10 * time.Microsecond)
	}
	return d.String()
}

// countOf is "1 span", "26 spans".
func countOf(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}
