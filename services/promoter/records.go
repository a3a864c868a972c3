package promoter

import (
	"context"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// maxTransitions bounds one ListTransitions answer.
const maxTransitions = 1000

// transitionKey is where a range's transition at an epoch is stored:
// <prefix>transitions/<range>/<epoch, 20 zero-padded digits>, so a prefix
// read sorted by key is sorted by epoch.
func (p *Promoter) transitionKey(rangeID string, epoch uint64) string {
	return fmt.Sprintf("%stransitions/%s/%020d", p.cfg.Prefix, rangeID, epoch)
}

// maxRecordsPerTxn bounds the transition records written in one etcd
// transaction: each is a put and a delete of the range's oldest records
// (Config.KeepTransitions), so 120 operations, below etcd's default limit of
// 128 per transaction.
const maxRecordsPerTxn = 60

// maxRecordBytesPerTxn bounds one transaction's size, well below etcd's
// default request limit of 1.5 MiB.
const maxRecordBytesPerTxn = 512 << 10

// recordRetryMax bounds the wait between attempts to write a batch.
const recordRetryMax = time.Second

// recorder writes transition records in batches, off the promotions' path:
// a record is an audit record, and a mass failover that wrote each in its
// own etcd transaction, inside the promotion's fan-out slot, spent a
// round trip per range on it. Records handed to it are written in order of
// arrival, up to maxRecordsPerTxn per transaction, and retried until written
// or until the etcd client is closed (then each waiter hears why). A writer
// goroutine runs only while records are pending.
type recorder struct {
	mu      sync.Mutex
	pending []pendingRecord
	running bool
}

type pendingRecord struct {
	key     string
	val     []byte
	rangeID string
	epoch   uint64
	done    func(error)
}

// recordTransition writes tr and waits until it is written or ctx ends.
func (p *Promoter) recordTransition(ctx context.Context, tr *tenurev1.Transition) error {
	done := make(chan error, 1)
	if err := p.recordLater(tr, func(err error) { done <- err }); err != nil {
		return err
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("transition record of %s at epoch %d not yet written: %w", tr.GetRangeId(), tr.GetEpoch(), ctx.Err())
	}
}

// recordLater queues tr to be written; done, if not nil, runs once it is
// written or can no longer be. tr must not change afterwards. A record
// larger than a transaction may be is refused here: etcd would refuse it
// on every attempt, and records are written in order, so it held every
// later one, of every range, behind it for good.
func (p *Promoter) recordLater(tr *tenurev1.Transition, done func(error)) error {
	b, err := proto.Marshal(tr)
	if err != nil {
		return err
	}
	if n := len(b); n > maxRecordBytesPerTxn {
		return fmt.Errorf("transition record of %s at epoch %d is %d bytes, more than the %d a record may take", tr.GetRangeId(), tr.GetEpoch(), n, maxRecordBytesPerTxn)
	}
	if done == nil {
		done = func(error) {}
	}
	r := &p.records
	r.mu.Lock()
	r.pending = append(r.pending, pendingRecord{key: p.transitionKey(tr.GetRangeId(), tr.GetEpoch()), val: b, rangeID: tr.GetRangeId(), epoch: tr.GetEpoch(), done: done})
	start := !r.running
	r.running = true
	r.mu.Unlock()
	if start {
		go p.writeRecords()
	}
	return nil
}

// writeRecords writes pending records, a batch per transaction, until none
// is left.
func (p *Promoter) writeRecords() {
	r := &p.records
	for {
		r.mu.Lock()
		n, size := 0, 0
		for n < min(len(r.pending), maxRecordsPerTxn) {
			size += len(r.pending[n].key) + len(r.pending[n].val)
			if n > 0 && size > maxRecordBytesPerTxn {
				break
			}
			n++
		}
		if n == 0 {
			r.running = false
			r.mu.Unlock()
			return
		}
		batch := r.pending[:n:n]
		r.pending = r.pending[n:]
		r.mu.Unlock()
		err := p.writeBatch(batch)
		for _, rec := range batch {
			rec.done(err)
		}
	}
}

// writeBatch writes one batch in one transaction, retrying with backoff
// while the etcd client is open.
func (p *Promoter) writeBatch(batch []pendingRecord) error {
	ops := make([]clientv3.Op, 0, 2*len(batch))
	lowest := make(map[string]uint64, len(batch)) // range -> its lowest epoch in the batch
	for _, rec := range batch {
		ops = append(ops, clientv3.OpPut(rec.key, string(rec.val)))
		if e, ok := lowest[rec.rangeID]; !ok || rec.epoch < e {
			lowest[rec.rangeID] = rec.epoch
		}
	}
	ops = append(ops, p.pruneOps(lowest)...)
	wait := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(p.cfg.Etcd.Ctx(), p.cfg.RPCTimeout)
		_, err := p.cfg.Etcd.Txn(ctx).Then(ops...).Commit()
		cancel()
		if err == nil {
			return nil
		}
		if p.cfg.Etcd.Ctx().Err() != nil {
			p.log.Error("transition records not stored: the etcd client is closed", "records", len(batch), "err", err)
			return err
		}
		p.log.Warn("transition records not stored yet; retrying", "records", len(batch), "attempt", attempt, "retry_in", wait, "err", err)
		time.Sleep(jitter(wait))
		wait = min(2*wait, recordRetryMax)
	}
}

// pruneOps deletes, for each range at epoch e, its records below epoch
// e-KeepTransitions+1: the newest KeepTransitions epochs are kept, this
// one included, and as every record has an epoch of its own at most
// KeepTransitions records remain. e is the range's lowest epoch in the
// batch, so no delete covers a put of the same transaction (etcd refuses a
// transaction whose put falls inside its own delete range); a later batch
// prunes the rest. Epochs start at 1, so nothing is deleted until a range's
// epoch passes KeepTransitions.
func (p *Promoter) pruneOps(lowest map[string]uint64) []clientv3.Op {
	keep := uint64(p.cfg.KeepTransitions)
	var ops []clientv3.Op
	for rangeID, e := range lowest {
		if e <= keep {
			continue
		}
		// Keys are zero-padded epochs under the range's own prefix, so
		// [epoch 0, epoch e-keep+1) is exactly its older records.
		ops = append(ops, clientv3.OpDelete(p.transitionKey(rangeID, 0), clientv3.WithRange(p.transitionKey(rangeID, e-keep+1))))
	}
	return ops
}

// transitions returns up to limit transition records of a range, newest first.
func (p *Promoter) transitions(ctx context.Context, rangeID string, limit int) ([]*tenurev1.Transition, error) {
	if limit <= 0 {
		limit = 50
	}
	limit = min(limit, maxTransitions)
	ctx, cancel := context.WithTimeout(ctx, p.cfg.RPCTimeout)
	defer cancel()
	resp, err := p.cfg.Etcd.Get(ctx, fmt.Sprintf("%stransitions/%s/", p.cfg.Prefix, rangeID),
		clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(int64(limit)))
	if err != nil {
		return nil, err
	}
	out := make([]*tenurev1.Transition, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		tr := &tenurev1.Transition{}
		if err := proto.Unmarshal(kv.Value, tr); err != nil {
			return nil, fmt.Errorf("transition record %s is unreadable: %w", kv.Key, err)
		}
		out = append(out, tr)
	}
	return out, nil
}

// deleteTransitions removes a range's transition records (the range was
// deleted).
func (p *Promoter) deleteTransitions(ctx context.Context, rangeID string) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.RPCTimeout)
	defer cancel()
	_, err := p.cfg.Etcd.Delete(ctx, fmt.Sprintf("%stransitions/%s/", p.cfg.Prefix, rangeID), clientv3.WithPrefix())
	return err
}

// recordedHWMs is how many of a range's latest transitions an unsafe
// promotion reads for the highest HWM seen.
const recordedHWMs = 20

// highestRecordedHWM is the highest committed bound (or HWM seen) the
// range's latest transition records name: records below it were
// acknowledged, whatever replicas survive to say so. 0 when none can be
// read (the unsafe report then rests on the fenced HWMs alone, and says
// so in the log).
func (m *promotion) highestRecordedHWM(ctx context.Context) uint64 {
	trs, err := m.p.transitions(ctx, m.rangeID, recordedHWMs)
	if err != nil {
		m.p.log.WarnContext(ctx, "unsafe promotion: transition records unreadable; the highest HWM seen is the fenced replicas' alone", "range", m.rangeID, "err", err)
		return 0
	}
	var hwm uint64
	for _, tr := range trs { // newest first
		if tr.GetUnsafe() {
			// An earlier unsafe promotion already gave up everything above
			// its own bound (and reported it): offsets there were written
			// anew since, so older bounds say nothing of them.
			return max(hwm, tr.GetCommittedBound())
		}
		hwm = max(hwm, tr.GetCommittedBound(), tr.GetHighestHwmSeen())
	}
	return hwm
}
