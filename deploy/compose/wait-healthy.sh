#!/usr/bin/env bash
# wait-healthy.sh PROJECT [TIMEOUT_SECONDS]: wait until every container of the
# compose project is running and, where it has a health check, healthy.
# Fails (and prints each container's state and last health output) when one
# exits or the timeout passes. Works with compose v1 and v2: both label their
# containers com.docker.compose.project.
set -euo pipefail
project=${1:?usage: wait-healthy.sh PROJECT [TIMEOUT_SECONDS]}
timeout=${2:-180}
deadline=$((SECONDS + timeout))

states() {
	docker ps -a --filter "label=com.docker.compose.project=${project}" -q |
		xargs -r docker inspect -f '{{index .Config.Labels "com.docker.compose.service"}} {{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}'
}

while :; do
	out=$(states)
	if [ -z "$out" ]; then
		echo "wait-healthy: project ${project} has no containers" >&2
		exit 1
	fi
	bad=$(awk '$2 != "running" || ($3 != "healthy" && $3 != "none")' <<<"$out")
	if [ -z "$bad" ]; then
		echo "wait-healthy: all $(wc -l <<<"$out") containers of ${project} are healthy ($((SECONDS))s)"
		exit 0
	fi
	if awk '$2 == "exited" || $2 == "dead" || $3 == "unhealthy"' <<<"$bad" | grep -q .; then
		echo "wait-healthy: a container of ${project} failed:" >&2
		break
	fi
	if [ "$SECONDS" -ge "$deadline" ]; then
		echo "wait-healthy: ${project} not healthy after ${timeout}s:" >&2
		break
	fi
	sleep 1
done
sort <<<"$out" >&2
docker ps -a --filter "label=com.docker.compose.project=${project}" -q |
	xargs -r docker inspect -f '{{.Name}}: {{if .State.Health}}{{range .State.Health.Log}}{{.Output}}{{end}}{{end}}' >&2 || true
exit 1
