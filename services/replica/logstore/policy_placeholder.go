package logstore

import "time"

// PLACEHOLDER from branch policy, until branch reclaim (which owns these,
// INTERFACES.md) is merged: the merge deletes this file. They answer "keep
// everything", so retention removes nothing meanwhile.

// StoredBytes placeholder: 0.
func (r *Range) StoredBytes() uint64 { return 0 }

// RetainBytes placeholder: the log start (nothing outside the limit).
func (r *Range) RetainBytes(limit uint64) uint64 { return r.LogStart() }

// RetainSince placeholder: the log start (nothing known to be older).
func (r *Range) RetainSince(t time.Time) uint64 { return r.LogStart() }
