#!/usr/bin/env bash
# smoke.sh: the compose smoke test (`make compose-smoke`). Brings up its own
# compose project (SMOKE_PROJECT, default tenuresmoke; ports published on
# ephemeral 127.0.0.1 ports, so it does not collide with `make up`), creates a
# range on three replicas, produces, docker-kills the leader's container,
# waits for the promotion, produces again, checks every acknowledged record is
# readable at its offset, restarts the killed replica and waits for it to
# follow and catch up, and finds the promotion's trace in Jaeger by the trace
# id of its transition record, then loads that trace's page in Jaeger's real
# UI in headless chromium (jaeger-ui-check.sh: the page must draw the promote
# and fence spans; screenshot in bin/jaeger-trace.png). Along the way it
# scrapes every service's Prometheus metrics (http://<service>:9090/metrics):
# under-replicated ranges are 0 before the kill, 1 once the new leader has
# waited for the dead one, 0 again after it rejoined; the promotions are
# counted. The stack is ALWAYS torn down with its volumes, also on failure or
# interruption. Every wait is bounded.
#
# Needs: the images (`make images`) and the static smoke client
# (bin/static/smoke, `make compose-smoke` builds both).
set -euo pipefail
cd "$(dirname "$0")/../.."

PROJECT=${SMOKE_PROJECT:-tenuresmoke}
COMPOSE_FILE=deploy/compose/docker-compose.yml
SMOKE_BIN=$(realpath "${SMOKE_BIN:-bin/static/smoke}")
# A missing file would make docker create a directory in its place.
[ -f "$SMOKE_BIN" ] && [ -x "$SMOKE_BIN" ] || { echo "smoke.sh: no smoke client at $SMOKE_BIN (make compose-smoke builds it)" >&2; exit 2; }
TENURE_IMAGE=${TENURE_IMAGE:-tenure/tenure:dev}
RANGE=${SMOKE_RANGE:-smoke-1}
RECORDS=${SMOKE_RECORDS:-200}
# SMOKE_TRACE=require (the default) fails when the transition record has no
# trace id; auto skips the trace check, loudly, in that case (binaries built
# without OTLP export); off skips it.
TRACE_MODE=${SMOKE_TRACE:-require}
# SMOKE_UI=require (the default) fails when there is no chromium to load the
# trace's page in Jaeger's UI; auto skips the browser check, loudly, then;
# off skips it.
UI_MODE=${SMOKE_UI:-require}
NET="${PROJECT}_tenure"
# The stack's certificates (make compose-certs; the Makefile exports the path).
CERTS=$(realpath "${TENURE_CERTS_DIR:-bin/compose-certs}")
[ -f "$CERTS/ca.pem" ] || { echo "smoke.sh: no certificates in $CERTS (make compose-certs makes them)" >&2; exit 2; }
export TENURE_CERTS_DIR=$CERTS
. deploy/compose/lib.sh

work=$(mktemp -d)
t0=$SECONDS
log() { printf '[smoke %3ds] %s\n' "$((SECONDS - t0))" "$*"; }
# smoke STEP ARGS...: run the smoke client on the stack's network (replicas
# advertise compose hostnames). Labelled, so teardown removes it even when a
# timeout killed the docker CLI.
# The stack runs mutual TLS: the client mounts its certificates and uses the
# operator's (which may also produce and consume).
smoke() {
	timeout --foreground 240 docker run --rm -i --network "$NET" --label "tenure.smoke=$PROJECT" \
		-v "$SMOKE_BIN:/smoke:ro" -v "$CERTS:/certs:ro" \
		-e SMOKE_TLS_CA=/certs/ca.pem -e SMOKE_TLS_CERT=/certs/operator.pem -e SMOKE_TLS_KEY=/certs/operator-key.pem \
		--entrypoint /smoke "$TENURE_IMAGE" "$@"
}

teardown() {
	local rc=$?
	trap - EXIT INT TERM
	set +e
	if [ "$rc" -ne 0 ]; then
		log "FAILED (exit $rc); container states and recent logs:"
		compose ps
		compose logs --no-color --tail 40 2>&1 | tail -n 400
	fi
	log "tearing down ${PROJECT} (containers, network, volumes)"
	docker ps -aq --filter "label=tenure.smoke=$PROJECT" | xargs -r docker rm -f >/dev/null
	compose_down
	rm -rf "$work"
	if [ "$rc" -eq 0 ]; then log "PASS"; else log "FAIL"; fi
	exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

log "compose: $COMPOSE; project $PROJECT; removing any leftover stack"
docker ps -aq --filter "label=tenure.smoke=$PROJECT" | xargs -r docker rm -f >/dev/null
compose down -v --remove-orphans >/dev/null 2>&1 || true

log "starting the stack"
compose up -d
COMPOSE="$COMPOSE" timeout --foreground 300 deploy/compose/wait-healthy.sh "$PROJECT" 240

# make up's port check and banner (deploy/compose/ports.sh) against this
# compose's real `docker ps` output: the ports as bound are found, and a
# stack that would publish on one of them is refused before it starts.
lease_addr=$(deploy/compose/ports.sh get "$PROJECT" lease-1 7000) ||
	{ log "ports.sh get: lease-1's published port not found"; exit 1; }
if TENURE_PUBLISH_LEASE=$lease_addr deploy/compose/ports.sh check "${PROJECT}-none" 2>"$work/ports"; then
	log "ports.sh check: accepted $lease_addr, which lease-1 holds"; exit 1
fi
grep -q TENURE_PUBLISH_LEASE "$work/ports" || { log "ports.sh check: no variable named: $(cat "$work/ports")"; exit 1; }
TENURE_PUBLISH_LEASE=$lease_addr deploy/compose/ports.sh check "$PROJECT" ||
	{ log "ports.sh check: refused lease-1's port to its own running project (make up twice)"; exit 1; }
log "ports.sh: lease-1 on $lease_addr; a second stack on it is refused"

replicas="replica-1=https://replica-1:7100,replica-2=https://replica-2:7100,replica-3=https://replica-3:7100"
log "creating range $RANGE on replica-1..3"
smoke create --range "$RANGE" --replicas "$replicas" --timeout 60s

out=$(smoke leader --range "$RANGE" --min-epoch 1 --timeout 90s)
read -r leader epoch <<<"$out"
log "leader of $RANGE: $leader at epoch $epoch"

log "producing $RECORDS records"
smoke produce --range "$RANGE" --count "$RECORDS" --tag before --timeout 120s >"$work/acked"
log "acknowledged: $(wc -l <"$work/acked") records"

# metrics_urls [EXCEPT]: every tenure service's metrics URL on the network
# (TENURE_METRICS_LISTEN 0.0.0.0:9090 in the compose file), but EXCEPT's.
metrics_urls() {
	local s out=()
	for s in lease-1 lease-2 replica-1 replica-2 replica-3 replica-4 promoter-1 promoter-2; do
		[ "$s" = "${1:-}" ] || out+=("http://$s:9090/metrics")
	done
	local IFS=,
	echo "${out[*]}"
}
log "metrics: every service serves them; one range led, none under-replicated"
smoke metrics --urls "$(metrics_urls)" --leaders 1 --under-replicated 0 --promoted-min 1 --timeout 60s

container=$(compose ps -q "$leader")
[ -n "$container" ] || { log "no container for service $leader"; exit 1; }
log "docker kill $leader (${container:0:12})"
kill_at=$SECONDS
docker kill "$container" >/dev/null

out=$(smoke leader --range "$RANGE" --min-epoch $((epoch + 1)) --not "$leader" --timeout 90s)
read -r leader2 epoch2 <<<"$out"
log "promoted: $leader2 at epoch $epoch2, serving $((SECONDS - kill_at))s after the kill"
log "metrics: the new leader's range is under-replicated (its follower $leader is gone), and the promotion counted"
smoke metrics --urls "$(metrics_urls "$leader")" --leaders 1 --under-replicated 1 --promoted-min 2 --timeout 60s

trace_id=$(smoke transition --range "$RANGE" --epoch "$epoch2" --timeout 60s)
log "transition record of epoch $epoch2: trace id '${trace_id}'"

log "producing $RECORDS more records"
smoke produce --range "$RANGE" --count "$RECORDS" --tag after --timeout 120s >>"$work/acked"
log "acknowledged in all: $(wc -l <"$work/acked") records"

log "verifying every acknowledged record on the new leader"
smoke verify --range "$RANGE" --timeout 60s <"$work/acked"

log "restarting $leader (its container and volume survive the kill)"
compose start "$leader" >/dev/null
smoke rejoin --range "$RANGE" --replica "https://$leader:7100" --epoch "$epoch2" --timeout 90s
log "metrics: $leader follows again, so the range is no longer under-replicated"
smoke metrics --urls "$(metrics_urls)" --leaders 1 --under-replicated 0 --timeout 60s

log "a stranger without a certificate cannot truncate: Truncate on $leader"
smoke refused --range "$RANGE" --replica "https://$leader:7100" --timeout 30s

case "$TRACE_MODE" in
off)
	log "trace check: SKIPPED (SMOKE_TRACE=off)"
	;;
*)
	if [ -z "$trace_id" ] || [ -z "${trace_id//0/}" ]; then
		if [ "$TRACE_MODE" = require ]; then
			log "trace check FAILED: the transition record has no trace id, so the promotion was not traced (SMOKE_TRACE=auto skips this check then)"
			exit 1
		fi
		log "trace check: SKIPPED: the transition record carries no trace id, so these binaries export no traces (SMOKE_TRACE=auto)"
	else
		log "fetching trace $trace_id from Jaeger's query API (jaeger:16686/api/traces/$trace_id)"
		# One fence span per replica (the dead one's fails, but is traced).
		smoke trace --trace-id "$trace_id" --span promote,fence-all,fence=3 --timeout 60s
		# The port compose published for Jaeger's UI: the host's browser's
		# way in, for tenurectl's link and the browser check.
		ui=$(compose port jaeger 16686)
		log "the same trace as tenurectl draws it"
		timeout --foreground 120 docker run --rm --network "$NET" --label "tenure.smoke=$PROJECT" -v "$CERTS:/certs:ro" \
			-e TENURECTL_CACERT=/certs/ca.pem -e TENURECTL_CERT=/certs/operator.pem -e TENURECTL_KEY=/certs/operator-key.pem \
			-e TENURECTL_JAEGER=http://jaeger:16686 -e TENURECTL_JAEGER_UI="http://$ui" "$TENURE_IMAGE" tenurectl trace "$trace_id"
		if [ "$UI_MODE" = off ]; then
			log "Jaeger UI check: SKIPPED (SMOKE_UI=off)"
		else
			log "the same trace in Jaeger's UI, in headless chromium: http://$ui/trace/$trace_id"
			rc=0
			deploy/compose/jaeger-ui-check.sh "http://$ui" "$trace_id" promote fence-all fence=3 || rc=$?
			case "$rc" in
			0) ;;
			3)
				if [ "$UI_MODE" = require ]; then
					log "Jaeger UI check FAILED: no chromium on this host (apt-get install chromium; SMOKE_UI=auto skips the check then)"
					exit 1
				fi
				log "Jaeger UI check: SKIPPED: no chromium on this host (SMOKE_UI=auto)"
				;;
			*) exit "$rc" ;;
			esac
		fi
	fi
	;;
esac
