package replica

import (
	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// LogForTest returns every record of a range's log, committed or not, so
// tests can compare replicas byte for byte.
func (s *Replica) LogForTest(rangeID string) ([]*tenurev1.Record, error) {
	h, err := s.lookup(rangeID)
	if err != nil {
		return nil, err
	}
	var out []*tenurev1.Record
	for end := h.r.LogEnd(); uint64(len(out)) < end; {
		recs, err := h.r.Read(uint64(len(out)), 0, 0)
		if err != nil {
			return nil, err
		}
		if len(recs) == 0 {
			break
		}
		out = append(out, recs...)
	}
	return out, nil
}

// SyncsOnDemandForTest reports whether a range's store syncs its writes on
// demand (logstore's SetSyncOnDemand).
func (s *Replica) SyncsOnDemandForTest(rangeID string) (bool, error) {
	h, err := s.lookup(rangeID)
	if err != nil {
		return false, err
	}
	return h.r.SyncsOnDemand(), nil
}
