package main

import (
	"fmt"

	"github.com/tenurelog/tenure/pkg/wire"
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// maxRedirects bounds how many not-leader answers one produce batch or one
// read follows: leadership moving faster than that is for a retry.
const maxRedirects = 3

// redirect is the leader a replica's not-leader answer (err) names, when it
// names one other than current, said on stderr; nil otherwise. The answer
// is a refusal: the request did nothing, so sending it to the leader named
// cannot do it twice.
func redirect(e *env, command string, err error, current *tenurev1.Replica) *tenurev1.Replica {
	d := wire.NotLeader(err)
	if d.GetLeaderUrl() == "" || d.GetLeaderUrl() == current.GetAddress() {
		return nil
	}
	if e.stderr != nil {
		fmt.Fprintf(e.stderr, "tenurectl %s: %s does not lead range %s; following its leader %s at %s (epoch %d)\n",
			command, current.GetId(), d.GetRangeId(), d.GetLeaderId(), d.GetLeaderUrl(), d.GetEpoch())
	}
	return &tenurev1.Replica{Id: d.GetLeaderId(), Address: d.GetLeaderUrl()}
}
