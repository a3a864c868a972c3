package wire

import (
	"time"

	tenurev1 "github.com/tenurelog/tenure/pkg/wire/tenure/v1"
)

// Retention defaults and bounds (RetentionPolicy in common.proto). One place,
// because the lease service writes the defaults, the replica applies them to
// a range whose policy it has not learned yet, and tenurectl prints them.
const (
	// DefaultRetentionAgeMs is the age limit of a range created without a
	// policy: 7 days, Kafka's retention.ms default. Age, not size, is the
	// default bound because a size that suits one range's traffic is wrong
	// for another's, while a week is a horizon most consumers fit in.
	DefaultRetentionAgeMs int64 = 7 * 24 * 60 * 60 * 1000
	// DefaultRetentionBytes is the size limit of a range created without a
	// policy: 0, unlimited (Kafka's retention.bytes default is -1, the same).
	DefaultRetentionBytes uint64 = 0
	// MaxRetentionAgeMs bounds max_age_ms: 100 years. It keeps
	// now - max_age a valid time.Time and max_age a valid time.Duration
	// (which overflows at ~292 years); longer is "unlimited", spelled 0.
	MaxRetentionAgeMs int64 = 100 * 365 * 24 * 60 * 60 * 1000
)

// DefaultRetention is a new copy of the default policy.
func DefaultRetention() *tenurev1.RetentionPolicy {
	return &tenurev1.RetentionPolicy{MaxBytes: DefaultRetentionBytes, MaxAgeMs: DefaultRetentionAgeMs}
}

// RetentionOrDefault is p, or the default policy when p is nil (a range
// stored before retention existed, or a request that names none).
func RetentionOrDefault(p *tenurev1.RetentionPolicy) *tenurev1.RetentionPolicy {
	if p == nil {
		return DefaultRetention()
	}
	return p
}

// ValidateRetention checks a policy: max_age_ms in [0, MaxRetentionAgeMs]
// (0 = unlimited). Every max_bytes is valid (0 = unlimited). nil is invalid:
// callers that mean the defaults say so with RetentionOrDefault.
func ValidateRetention(p *tenurev1.RetentionPolicy) error {
	if p == nil {
		return invalidf("retention policy is missing (0 means unlimited for each of max_bytes and max_age_ms)")
	}
	if a := p.GetMaxAgeMs(); a < 0 || a > MaxRetentionAgeMs {
		return invalidf("retention max_age_ms %d: want 0 (unlimited) to %d (100 years)", a, MaxRetentionAgeMs)
	}
	return nil
}

// RetentionAge is max_age_ms as a Duration (0 = unlimited). Valid only for a
// policy ValidateRetention accepts.
func RetentionAge(p *tenurev1.RetentionPolicy) time.Duration {
	return time.Duration(p.GetMaxAgeMs()) * time.Millisecond
}
