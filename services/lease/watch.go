package lease

import (
	"context"
	"errors"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// errServiceClosing is the cause that ends watch streams on Close.
var errServiceClosing = errors.New("service instance is shutting down")

// WatchLeases implements LeaseService.WatchLeases: one etcd watch on the
// whole prefix from after_revision+1, translated event by event. etcd's watch
// delivers every revision after the start exactly once and in order, and
// never splits one revision across responses, which is what lets resumption
// miss nothing and repeat nothing.
func (s *Service) WatchLeases(ctx context.Context, req *connect.Request[tenurev1.WatchLeasesRequest], stream *connect.ServerStream[tenurev1.WatchLeasesResponse]) error {
	msg := req.Msg
	if n := len(msg.GetRangeIds()); n > MaxWatchRanges {
		return invalidf("watch names %d ranges, at most %d (an empty list watches all)", n, MaxWatchRanges)
	}
	var filter map[string]bool
	if len(msg.GetRangeIds()) > 0 {
		filter = make(map[string]bool, len(msg.GetRangeIds()))
		for _, id := range msg.GetRangeIds() {
			if err := wire.ValidateRangeID(id); err != nil {
				return toConnect(ctx, err)
			}
			filter[id] = true
		}
	}
	after := msg.GetAfterRevision()
	if after < 0 {
		return invalidf("after_revision %d: pass 0 (from now) or the revision of the last event seen", after)
	}

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-s.closing:
			cancel(errServiceClosing)
		case <-ctx.Done():
		}
	}()

	if after == 0 {
		// "From now" is the current revision, made explicit so the stream
		// starts at a definite point.
		bctx, bcancel := s.bound(ctx)
		r, err := s.kv.Get(bctx, s.keys.prefix, clientv3.WithCountOnly())
		bcancel()
		if err != nil {
			return toConnect(bctx, err)
		}
		after = r.Header.Revision
	}
	// WithRequireLeader: an etcd member cut off from its leader ends the watch
	// (Unavailable) instead of silently delivering nothing.
	wch := s.watcher.Watch(clientv3.WithRequireLeader(ctx), s.keys.prefix,
		clientv3.WithPrefix(), clientv3.WithRev(after+1), clientv3.WithPrevKV())
	// The client's call returns once it has the response headers; send them
	// now rather than with the first event, which may be long in coming.
	if err := stream.Send(nil); err != nil {
		return err
	}
	warn := func(key string, err error) {
		s.log.Warn("lease: watch skips a corrupt value", "key", key, "err", err)
	}
	for wr := range wch {
		if wr.CompactRevision != 0 {
			return outOfRangef("events after revision %d are compacted (etcd keeps revisions from %d on): re-read the ranges with GetRange or ListRanges and watch again with after_revision 0",
				after, wr.CompactRevision)
		}
		if err := wr.Err(); err != nil {
			return s.watchEnded(ctx, err)
		}
		for _, ev := range translate(s.keys, wr.Events, filter, warn) {
			if err := stream.Send(ev); err != nil {
				return err
			}
		}
	}
	return s.watchEnded(ctx, nil)
}

// watchEnded is how a watch stream ends: err is the etcd watch's error, nil
// when its channel closed.
func (s *Service) watchEnded(ctx context.Context, err error) error {
	switch {
	case errors.Is(context.Cause(ctx), errServiceClosing):
		return unavailablef("%v: resume on another instance with after_revision", errServiceClosing)
	case ctx.Err() != nil:
		return toConnect(ctx, ctx.Err())
	case err != nil:
		return toConnect(ctx, err)
	}
	return unavailablef("etcd watch ended: resume with after_revision")
}

// translate turns etcd events (in revision order) into lease events: at most
// one per range per revision, in revision order, and within a revision in the
// order the range first appears. filter nil means every range. It is pure
// apart from warn, called for values it cannot decode.
func translate(keys layout, evs []*clientv3.Event, filter map[string]bool, warn func(key string, err error)) []*tenurev1.WatchLeasesResponse {
	var out []*tenurev1.WatchLeasesResponse
	for i := 0; i < len(evs); {
		rev := evs[i].Kv.ModRevision
		j := i + 1
		for j < len(evs) && evs[j].Kv.ModRevision == rev {
			j++
		}
		out = appendRevision(out, keys, evs[i:j], rev, filter, warn)
		i = j
	}
	return out
}

// rangeChange is what one revision did to one range.
type rangeChange struct {
	granted   uint64 // epoch written, if > 0
	leaseType tenurev1.LeaseEventType
	lease     leaseRecord
	members   bool
}

func appendRevision(out []*tenurev1.WatchLeasesResponse, keys layout, evs []*clientv3.Event, rev int64, filter map[string]bool, warn func(string, error)) []*tenurev1.WatchLeasesResponse {
	// Sessions that CloseSession marked closing and that this revision
	// deleted: their lease deletions are releases, not expiries. An etcd lease
	// revoke deletes every attached key in one revision, so the session record
	// and the lease keys arrive together.
	closing := map[int64]bool{}
	for _, ev := range evs {
		if ev.Type != clientv3.EventTypeDelete || ev.PrevKv == nil {
			continue
		}
		if kind, _ := keys.parse(string(ev.Kv.Key)); kind != kindSession {
			continue
		}
		if rec, err := decodeSession(string(ev.PrevKv.Key), ev.PrevKv.Value); err == nil && rec.Closing {
			closing[ev.PrevKv.Lease] = true
		}
	}

	var order []string
	changes := map[string]*rangeChange{}
	for _, ev := range evs {
		kind, id := keys.parse(string(ev.Kv.Key))
		if kind != kindEpoch && kind != kindLease && kind != kindMembers {
			continue
		}
		if filter != nil && !filter[id] {
			continue
		}
		c := changes[id]
		if c == nil {
			c = &rangeChange{}
			changes[id] = c
			order = append(order, id)
		}
		put := ev.Type == clientv3.EventTypePut
		switch {
		case kind == kindEpoch && put:
			e, err := parseEpoch(string(ev.Kv.Key), ev.Kv.Value)
			if err != nil {
				warn(string(ev.Kv.Key), err)
				continue
			}
			// Epoch 0 is CreateRange's initial value, not a grant.
			if e > 0 {
				c.granted = e
			}
		case kind == kindLease && put:
			rec, err := decodeLease(string(ev.Kv.Key), ev.Kv.Value)
			if err != nil {
				warn(string(ev.Kv.Key), err)
				continue
			}
			c.lease, c.leaseType = rec, tenurev1.LeaseEventType_LEASE_EVENT_TYPE_BOUND
			if rec.Released {
				c.leaseType = tenurev1.LeaseEventType_LEASE_EVENT_TYPE_RELEASED
			}
		case kind == kindLease:
			c.leaseType = tenurev1.LeaseEventType_LEASE_EVENT_TYPE_EXPIRED
			if ev.PrevKv != nil {
				if closing[ev.PrevKv.Lease] {
					c.leaseType = tenurev1.LeaseEventType_LEASE_EVENT_TYPE_RELEASED
				}
				if rec, err := decodeLease(string(ev.PrevKv.Key), ev.PrevKv.Value); err == nil {
					c.lease = rec
				}
			}
		case kind == kindMembers:
			// Created, changed, or deleted (DeleteRange).
			c.members = true
		}
	}

	for _, id := range order {
		c := changes[id]
		ev := &tenurev1.WatchLeasesResponse{RangeId: id, Revision: rev}
		switch {
		case c.granted > 0:
			// A grant writes the epoch and binds its lease in one
			// transaction: one GRANTED event, naming the holder bound.
			ev.Type, ev.Epoch, ev.HolderId = tenurev1.LeaseEventType_LEASE_EVENT_TYPE_GRANTED, c.granted, c.lease.HolderID
		case c.leaseType != tenurev1.LeaseEventType_LEASE_EVENT_TYPE_UNSPECIFIED:
			ev.Type, ev.Epoch, ev.HolderId = c.leaseType, c.lease.Epoch, c.lease.HolderID
		case c.members:
			ev.Type = tenurev1.LeaseEventType_LEASE_EVENT_TYPE_MEMBERSHIP
		default:
			continue // e.g. a corrupt value, already warned about
		}
		out = append(out, ev)
	}
	return out
}
