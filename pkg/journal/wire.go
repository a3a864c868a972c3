package journal

import tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"

// ToWire converts a history to its wire form.
func ToWire(h []EpochStart) []*tenurev1.EpochStart {
	out := make([]*tenurev1.EpochStart, len(h))
	for i, e := range h {
		out[i] = &tenurev1.EpochStart{Epoch: e.Epoch, StartOffset: e.Start}
	}
	return out
}

// FromWire converts a history received from a peer. It does not validate:
// callers check it with wire.ValidateHistory first, since a peer's history
// is a claim.
func FromWire(h []*tenurev1.EpochStart) []EpochStart {
	out := make([]EpochStart, len(h))
	for i, e := range h {
		out[i] = EpochStart{Epoch: e.GetEpoch(), Start: e.GetStartOffset()}
	}
	return out
}
