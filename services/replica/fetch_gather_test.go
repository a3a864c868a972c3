package replica

import "testing"

func TestBurstPending(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		appends, waveAt, wave uint64
		want                  bool
	}{
		{"nothing acknowledged yet", 5, 0, 0, false},
		{"one in flight, its successor arrived", 11, 10, 1, false},
		{"one in flight, successor not yet arrived", 10, 10, 1, true},
		{"64 acknowledged, 1 arrived", 101, 100, 64, true},
		{"64 acknowledged, 63 arrived", 163, 100, 64, true},
		{"64 acknowledged, all arrived", 164, 100, 64, false},
		{"more arrived than acknowledged (other clients)", 200, 100, 64, false},
	} {
		if got := burstPending(tc.appends, tc.waveAt, tc.wave); got != tc.want {
			t.Errorf("%s: burstPending(%d, %d, %d) = %v, want %v", tc.name, tc.appends, tc.waveAt, tc.wave, got, tc.want)
		}
	}
}
