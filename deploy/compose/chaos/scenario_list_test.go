package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// chaos.sh checks CHAOS_SCENARIOS against its own list before it starts a
// stack (a misspelt name fails in a second, not after the stack is up); that
// list and the driver's must be the same, in the same order (the default run).
func TestChaosShScenariosMatchDriver(t *testing.T) {
	b, err := os.ReadFile("../chaos.sh")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^ALL_SCENARIOS=(\S+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("chaos.sh: no ALL_SCENARIOS=... line")
	}
	if got, want := string(m[1]), strings.Join(allScenarios, ","); got != want {
		t.Fatalf("chaos.sh ALL_SCENARIOS=%s\ndriver's allScenarios: %s", got, want)
	}
	for _, s := range allScenarios {
		if scenarioFuncs[s] == nil {
			t.Errorf("scenario %q is listed but has no function", s)
		}
	}
	if len(scenarioFuncs) != len(allScenarios) {
		t.Errorf("%d scenario functions, %d listed", len(scenarioFuncs), len(allScenarios))
	}
}
