//go:build !race

package bench

// raceEnabled: this benchmark binary was built with -race.
const raceEnabled = false
