#!/bin/sh
# interleave.sh ROUNDS DURATION BINARY... runs every bench binary once per
# round, in turn (A B A B ...), so that load from elsewhere on the machine
# hits each alike, and writes each binary's runs to BINARY.txt (appending).
# Then: go run ./cmd/benchratio BINARY.txt... prints medians and per-run
# ratios to JetStream. Build a binary with `go test -c -o /tmp/bench.X .`.
#
#	./interleave.sh 4 3s /tmp/bench.head /tmp/bench.final
set -eu
if [ $# -lt 3 ]; then
	echo "usage: $0 ROUNDS DURATION BINARY..." >&2
	exit 2
fi
rounds=$1 duration=$2
shift 2
i=1
while [ "$i" -le "$rounds" ]; do
	for bin in "$@"; do
		echo "round $i/$rounds: $bin ($(date +%T), load $(cut -d' ' -f1 /proc/loadavg))" >&2
		# A failed run (its first Append error) is kept in the output:
		# benchratio counts only the results that are there.
		"$bin" -test.run='^$' -test.bench=. -bench.duration="$duration" >>"$bin.txt" 2>&1 || echo "  $bin exited $?" >&2
	done
	i=$((i + 1))
done
