//go:build race

package promoter

// raceEnabled: the race detector slows this cluster-in-one-process by an
// order of magnitude, so scale tests size themselves down under it.
const raceEnabled = true
