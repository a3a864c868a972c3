package promoter

import (
	"context"
	"fmt"

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

func (p *Promoter) recordTransition(ctx context.Context, tr *tenurev1.Transition) error {
	b, err := proto.Marshal(tr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.RPCTimeout)
	defer cancel()
	_, err = p.cfg.Etcd.Put(ctx, p.transitionKey(tr.GetRangeId(), tr.GetEpoch()), string(b))
	return err
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
