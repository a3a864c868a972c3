package main

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

const setAddressHelp = `
Change the address the lease service records for members of a range, and
nothing else: who the members are, their roles and incarnations stay as they
are (membership changes one replica at a time with add-replica,
remove-replica and replace-replica).

Use it when a replica moved: restarted with the same data directory on
another host or port. The promoter reads the new address within its refresh
interval and tells the range's members about it; 'tenurectl status RANGE'
shows each member at its new address. It is also how a member listed at
the wrong address (status says MISDIRECTED, the address answers as another
replica) is corrected.

An address another member of the range already has is refused: both members
would be the one replica that answers there.
`

// setAddressAttempts bounds the re-reads when the range's membership moved
// between reading it and writing (a promotion recording incarnations).
const setAddressAttempts = 5

func runRangeSetAddress(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "range set-address", "RANGE ID=URL[,ID=URL...]", setAddressHelp)
	o := addClusterFlags(e, fs)
	positional, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(positional) != 2 {
		return usagef("want RANGE and ID=URL[,ID=URL...], got %d arguments", len(positional))
	}
	rangeID := positional[0]
	want, err := parseReplicas("the new addresses", positional[1], o.tls())
	if err != nil {
		return err
	}
	c := newClients(o)
	defer c.close()
	for attempt := 1; ; attempt++ {
		cur, err := c.getRange(ctx, rangeID)
		if err != nil {
			return err
		}
		next, changed, err := withAddresses(cur, want)
		if err != nil {
			return err
		}
		if len(changed) == 0 {
			if *o.json {
				return writeProtoJSON(e.stdout, cur)
			}
			fmt.Fprintf(e.stdout, "range %s: nothing to change; %s already at %s\n", rangeID, describeIDs(want), describeReplicas(want))
			return nil
		}
		cctx, cancel := context.WithTimeout(ctx, rpcTimeout)
		resp, err := c.lease.SetReplicas(cctx, connect.NewRequest(&tenurev1.SetReplicasRequest{
			RangeId: rangeID, Replicas: next, ExpectedRevision: cur.GetMembershipRevision()}))
		cancel()
		switch connect.CodeOf(err) {
		case connect.CodeAborted:
			// The membership record moved since it was read: read it again.
			if attempt < setAddressAttempts {
				continue
			}
			return fmt.Errorf("range %s: its membership kept changing under %d attempts (a membership change in flight?); try again: %s", rangeID, attempt, connectMessage(err))
		case connect.CodeFailedPrecondition, connect.CodeInvalidArgument:
			return fmt.Errorf("the lease service refused the addresses: %s", connectMessage(err))
		case connect.CodeNotFound:
			return fmt.Errorf("range %q does not exist; 'tenurectl range list' lists ranges", rangeID)
		}
		if err != nil {
			return c.leaseErr(err)
		}
		if *o.json {
			return writeProtoJSON(e.stdout, resp.Msg.GetRange())
		}
		for _, ch := range changed {
			fmt.Fprintf(e.stdout, "range %s: %s %s -> %s\n", rangeID, ch.id, ch.from, ch.to)
		}
		fmt.Fprintf(e.stdout, "the promoter tells the members within its refresh interval; 'tenurectl status %s' shows them\n", rangeID)
		return nil
	}
}

type addressChange struct{ id, from, to string }

// withAddresses is cur's replica set with want's addresses, and what
// changed. Every replica of want must be a member, and no two members may
// end at one address.
func withAddresses(cur *tenurev1.RangeInfo, want []*tenurev1.Replica) ([]*tenurev1.Replica, []addressChange, error) {
	next := make([]*tenurev1.Replica, len(cur.GetReplicas()))
	var changed []addressChange
	for i, m := range cur.GetReplicas() {
		next[i] = proto.Clone(m).(*tenurev1.Replica)
		for _, w := range want {
			if w.GetId() == m.GetId() && w.GetAddress() != m.GetAddress() {
				changed = append(changed, addressChange{m.GetId(), m.GetAddress(), w.GetAddress()})
				next[i].Address = w.GetAddress()
			}
		}
	}
	for _, w := range want {
		if !hasMember(cur.GetReplicas(), w.GetId()) {
			return nil, nil, fmt.Errorf("range %s has no member %s (members: %s); add one with 'tenurectl range add-replica'",
				cur.GetRangeId(), w.GetId(), describeIDs(cur.GetReplicas()))
		}
	}
	for i, a := range next {
		for _, b := range next[i+1:] {
			if a.GetAddress() == b.GetAddress() {
				return nil, nil, fmt.Errorf("range %s: %s and %s would both be at %s: one address answers as one replica", cur.GetRangeId(), a.GetId(), b.GetId(), a.GetAddress())
			}
		}
	}
	return next, changed, nil
}

func describeIDs(rs []*tenurev1.Replica) string {
	ids := make([]string, len(rs))
	for i, r := range rs {
		ids[i] = r.GetId()
	}
	slices.Sort(ids)
	return strings.Join(ids, ", ")
}
