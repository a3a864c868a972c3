//go:build !race

package promoter

const raceEnabled = false
