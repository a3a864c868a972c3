package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/tenurelog/tenure/internal/chaos/check"
	"github.com/tenurelog/tenure/pkg/transport"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
	"github.com/tenurelog/tenure/pkg/wire/tenure/v1/tenurev1connect"
)

// replicaIDs are the compose services (and replica ids) every scenario's
// range is created on: its members until a membership change (a scenario's
// current members are scenario.members).
var replicaIDs = []string{"replica-1", "replica-2", "replica-3"}

// spareID is the fourth replica: in the stack, a member of no range until a
// scenario adds it (replace-replica).
const spareID = "replica-4"

// allReplicaIDs are every replica container: the ones the workload, the
// poller and the checks' clients can reach, so that a client follows a
// leader wherever the range's members are.
var allReplicaIDs = append(append([]string(nil), replicaIDs...), spareID)

// replicaURL is how replicas, the promoter and this driver name a replica.
func replicaURL(id string) string { return scheme() + "://" + id + ":7100" }

// statusOf asks one replica for its status of range rng, bounded.
func statusOf(ctx context.Context, c tenurev1connect.ReplicaServiceClient, rng string) (*tenurev1.RangeStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	resp, err := c.GetStatus(ctx, connect.NewRequest(&tenurev1.ReplicaServiceGetStatusRequest{RangeId: rng}))
	if err != nil {
		return nil, err
	}
	for _, r := range resp.Msg.GetRanges() {
		if r.GetRangeId() == rng {
			return r, nil
		}
	}
	return nil, fmt.Errorf("does not host range %s", rng)
}

// historySample is one replica's epoch history as GetEpochHistory answered
// it at At: the source for the fence-time histories that transition records
// lack (see truncations).
type historySample struct {
	Replica string
	At      time.Time
	LogEnd  uint64
	History []check.EpochStart
}

// observer polls every replica's status and epoch history of one range
// while a scenario runs. From the status it keeps HWM samples and, since a
// replica's fenced epoch is durable and never decreases, a Fenced event per
// sample: the checker then flags any later acceptance below it.
type observer struct {
	rng      string
	replicas map[string]tenurev1connect.ReplicaServiceClient

	mu          sync.Mutex
	incarnation map[string]int
	hwms        []check.HWMSample
	fences      []check.EpochEvent
	histories   []historySample
}

func newObserver(rng string, replicas map[string]tenurev1connect.ReplicaServiceClient, incarnation map[string]int) *observer {
	inc := map[string]int{}
	for k, v := range incarnation {
		inc[k] = v
	}
	return &observer{rng: rng, replicas: replicas, incarnation: inc}
}

// restarted marks that id was killed: its later HWM samples belong to a new
// incarnation (a kill may lose an HWM persisted lazily; a clean stop does not).
func (o *observer) restarted(id string) {
	o.mu.Lock()
	o.incarnation[id]++
	o.mu.Unlock()
}

// run polls every period until ctx ends.
func (o *observer) run(ctx context.Context, period time.Duration) {
	var wg sync.WaitGroup
	for id, c := range o.replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				o.poll(ctx, id, c)
				select {
				case <-ctx.Done():
				case <-time.After(period):
				}
			}
		}()
	}
	wg.Wait()
}

func (o *observer) poll(ctx context.Context, id string, c tenurev1connect.ReplicaServiceClient) {
	o.mu.Lock()
	inc := o.incarnation[id]
	o.mu.Unlock()
	call := time.Now()
	st, err := statusOf(ctx, c, o.rng)
	ret := time.Now()
	if err == nil {
		o.mu.Lock()
		o.hwms = append(o.hwms, check.HWMSample{Replica: id, Incarnation: inc, Range: o.rng, HWM: st.GetHighWaterMark(), At: ret})
		if st.GetFencedEpoch() > 0 {
			o.fences = append(o.fences, check.EpochEvent{Replica: id, Range: o.rng, Kind: check.Fenced, Epoch: st.GetFencedEpoch(), Call: call, Return: ret})
		}
		o.mu.Unlock()
	}
	hctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	resp, err := c.GetEpochHistory(hctx, connect.NewRequest(&tenurev1.GetEpochHistoryRequest{RangeId: o.rng}))
	cancel()
	if err == nil {
		hs := historySample{Replica: id, At: time.Now(), LogEnd: resp.Msg.GetLogEnd()}
		for _, e := range resp.Msg.GetHistory() {
			hs.History = append(hs.History, check.EpochStart{Epoch: e.GetEpoch(), Start: e.GetStartOffset()})
		}
		o.mu.Lock()
		o.histories = append(o.histories, hs)
		o.mu.Unlock()
	}
}

// transitions reads the range's transition records through tenurectl
// (`tenurectl --json transitions`), from whichever promoter answers.
func transitions(ctx context.Context, tenurectl string, s *stack, rng string) ([]*tenurev1.Transition, error) {
	var errs []string
	for _, p := range []string{"promoter-1", "promoter-2"} {
		out, err := runTenurectl(ctx, tenurectl, "--promoter", s.url(p, "7200"), "--json", "transitions", "--limit", "1000", rng)
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", p, err))
			continue
		}
		var raws []json.RawMessage
		if err := json.Unmarshal(out, &raws); err != nil {
			return nil, fmt.Errorf("tenurectl transitions: %w", err)
		}
		var trs []*tenurev1.Transition
		for _, raw := range raws {
			t := &tenurev1.Transition{}
			if err := protojson.Unmarshal(raw, t); err != nil {
				return nil, fmt.Errorf("tenurectl transitions: %w", err)
			}
			trs = append(trs, t)
		}
		// Oldest first, for reading.
		sort.Slice(trs, func(i, j int) bool { return trs[i].GetEpoch() < trs[j].GetEpoch() })
		return trs, nil
	}
	return nil, fmt.Errorf("no promoter listed the transitions: %s", strings.Join(errs, "; "))
}

// runTenurectl runs tenurectl with the operator's certificate, bounded, and
// returns its stdout.
func runTenurectl(ctx context.Context, tenurectl string, args ...string) ([]byte, error) {
	return runTenurectlWithin(ctx, 60*time.Second, tenurectl, args...)
}

// runTenurectlWithin is runTenurectl bounded by within instead: a
// membership change waits for a learner's catch-up.
func runTenurectlWithin(ctx context.Context, within time.Duration, tenurectl string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, tenurectl, args...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	cmd.Env = append(os.Environ(), tenurectlTLSEnv...)
	if err := cmd.Run(); err != nil {
		// What it printed before failing too: a membership change's phases.
		return out.Bytes(), fmt.Errorf("tenurectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errOut.String()))
	}
	return out.Bytes(), nil
}

// truncationsOf turns the transition records' commanded truncations into
// check.Truncations. A record has each fenced replica's log end and last
// epoch but not its history; the history is taken from the newest polled
// sample of that replica, taken before the promotion ended, whose log end
// is the truncation's from-offset and whose last epoch is the fence
// answer's: the log then held exactly the records the fence saw. Without
// such a sample (the replica was unreachable to the poller), History stays
// empty and the acked-truncation checker cannot attribute that truncation;
// unattributed counts those.
func truncationsOf(trs []*tenurev1.Transition, samples []historySample) (out []check.Truncation, unattributed int) {
	for _, t := range trs {
		end := time.UnixMilli(t.GetStartedUnixMs()).Add(time.Duration(t.GetDurationUs())*time.Microsecond + time.Second)
		lastEpoch := map[string]uint64{}
		for _, f := range t.GetReplicas() {
			lastEpoch[f.GetReplicaId()] = f.GetLastEpoch()
		}
		for _, tr := range t.GetTruncations() {
			ct := check.Truncation{Replica: tr.GetReplicaId(), Range: t.GetRangeId(), Epoch: t.GetEpoch(), To: tr.GetToOffset(), LogEnd: tr.GetFromOffset()}
			var best *historySample
			for i := range samples {
				h := &samples[i]
				if h.Replica != ct.Replica || h.At.After(end) || h.LogEnd != ct.LogEnd || len(h.History) == 0 ||
					h.History[len(h.History)-1].Epoch != lastEpoch[ct.Replica] {
					continue
				}
				if best == nil || h.At.After(best.At) {
					best = h
				}
			}
			if best != nil {
				ct.History = best.History
			} else {
				unattributed++
			}
			out = append(out, ct)
		}
	}
	return out, unattributed
}

// ackEvents turns the OK appends into Acked events of the replica that led
// their epoch (only the leader of an epoch acknowledges under it; the
// transition records say who that was). With the polled Fenced events, the
// stale-epoch checker then catches a replica acknowledging under an epoch
// below one it had been seen fenced at: the zombie leader's late acks.
func ackEvents(ops []check.Op, trs []*tenurev1.Transition) []check.EpochEvent {
	leaderOf := map[uint64]string{}
	for _, t := range trs {
		leaderOf[t.GetEpoch()] = t.GetLeaderId()
	}
	var evs []check.EpochEvent
	for _, op := range ops {
		if op.Kind != check.Append || op.Outcome != check.OK || leaderOf[op.Epoch] == "" {
			continue
		}
		evs = append(evs, check.EpochEvent{Replica: leaderOf[op.Epoch], Range: op.Range, Kind: check.Acked, Epoch: op.Epoch, Call: op.Call, Return: op.Return})
	}
	return evs
}

// dumpJSON is what `tenurectl log dump --json` prints (cmd/tenurectl/logdump.go).
type dumpJSON struct {
	Range         string `json:"range_id"`
	LogStart      uint64 `json:"log_start"`
	LogEnd        uint64 `json:"log_end"`
	HighWaterMark uint64 `json:"high_water_mark"`
	FencedEpoch   uint64 `json:"fenced_epoch"`
	History       []struct {
		Epoch uint64 `json:"epoch"`
		Start uint64 `json:"start"`
	} `json:"history"`
	Records []struct {
		Offset     uint64 `json:"offset"`
		Epoch      uint64 `json:"epoch"`
		EpochStart bool   `json:"epoch_start"`
		// As consume --json: text, or base64 when not UTF-8.
		Value       string `json:"value"`
		ValueBase64 []byte `json:"value_base64"`
	} `json:"records"`
}

// finalLog reads a replica's final log of rng through tenurectl from a copy
// of its data directory.
func finalLog(ctx context.Context, tenurectl, replica, dataDir, rng string) (check.ReplicaLog, error) {
	out, err := runTenurectl(ctx, tenurectl, "log", "dump", "--json", "--data-dir", dataDir, "--range", rng)
	if err != nil {
		return check.ReplicaLog{}, err
	}
	return parseLogDump(replica, out)
}

// parseLogDump turns `tenurectl log dump --json` output into the replica's
// final log. A log retention trimmed starts at log_start, with records from
// there: the checkers (package check) take what is below it as deleted on
// purpose, as for the in-process harness's logs.
func parseLogDump(replica string, out []byte) (check.ReplicaLog, error) {
	var d dumpJSON
	if err := json.Unmarshal(out, &d); err != nil {
		return check.ReplicaLog{}, fmt.Errorf("tenurectl log dump: %w", err)
	}
	l := check.ReplicaLog{Replica: replica, Range: d.Range, LogStart: d.LogStart, LogEnd: d.LogEnd, HWM: d.HighWaterMark, FencedEpoch: d.FencedEpoch}
	for _, h := range d.History {
		l.History = append(l.History, check.EpochStart{Epoch: h.Epoch, Start: h.Start})
	}
	for _, r := range d.Records {
		value := []byte(r.Value)
		if r.ValueBase64 != nil {
			value = r.ValueBase64
		}
		l.Records = append(l.Records, check.Record{Offset: r.Offset, Epoch: r.Epoch, Value: value, EpochStart: r.EpochStart})
	}
	return l, nil
}

func newReplicaClients(s *stack) map[string]tenurev1connect.ReplicaServiceClient {
	hc := s.httpClient()
	m := map[string]tenurev1connect.ReplicaServiceClient{}
	for _, id := range allReplicaIDs {
		m[id] = tenurev1connect.NewReplicaServiceClient(hc, replicaURL(id), transport.ClientOptions()...)
	}
	return m
}

// newLogClient is a LogService client of one replica, at its compose URL
// (the stack's HTTP client dials its published port).
func newLogClient(s *stack, id string) tenurev1connect.LogServiceClient {
	return tenurev1connect.NewLogServiceClient(s.httpClient(), replicaURL(id), transport.ClientOptions()...)
}
