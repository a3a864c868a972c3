#!/usr/bin/env bash
# jaeger-ui-local.sh: the Jaeger UI check without Docker (`make jaeger-ui-local`).
# Runs the Jaeger of the image (bin/static/jaeger, v1.75.0) as a plain process
# on loopback, serving the same UI files (bin/jaeger-ui) the image serves,
# exports a promotion's trace to it from `tenure dev` (the embedded cluster's
# scripted failover), and runs jaeger-ui-check.sh on that trace: headless
# chromium must draw the promote, fence-all and fence spans; the screenshot
# lands in bin/jaeger-trace.png. Jaeger is stopped whatever happens; every
# wait is bounded.
#
# Env: JAEGER_LOCAL_UI (default 127.0.0.1:16696) and JAEGER_LOCAL_OTLP
# (default 127.0.0.1:4328): Jaeger's UI/query and OTLP/HTTP addresses, off
# the compose stack's 16686 and 4318 so both can run at once.
set -euo pipefail
cd "$(dirname "$0")/../.."

JAEGER=${JAEGER_BIN:-bin/static/jaeger}
UI_DIR=${JAEGER_UI_DIR:-bin/jaeger-ui}
TENURE=${TENURE_BIN:-bin/tenure}
UI_ADDR=${JAEGER_LOCAL_UI:-127.0.0.1:16696}
OTLP_ADDR=${JAEGER_LOCAL_OTLP:-127.0.0.1:4328}
for f in "$JAEGER" "$TENURE" "$UI_DIR/index.html"; do
	[ -f "$f" ] || { echo "jaeger-ui-local: no $f (make jaeger-ui-local builds it)" >&2; exit 2; }
done

t0=$SECONDS
log() { printf '[jaeger-ui-local %3ds] %s\n' "$((SECONDS - t0))" "$*"; }
work=$(mktemp -d)
jaeger_pid=
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	if [ -n "$jaeger_pid" ]; then
		kill "$jaeger_pid" 2>/dev/null || true
		# Bounded: a Jaeger that does not stop within 10 s is killed.
		for _ in $(seq 20); do kill -0 "$jaeger_pid" 2>/dev/null || break; sleep 0.5; done
		kill -9 "$jaeger_pid" 2>/dev/null || true
		wait "$jaeger_pid" 2>/dev/null || true
	fi
	if [ "$rc" -ne 0 ] && [ -f "$work/jaeger.log" ]; then
		log "FAILED (exit $rc); Jaeger's log:"
		tail -n 30 "$work/jaeger.log"
	fi
	rm -rf "$work"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# deploy/compose/jaeger.yaml without TLS and on loopback: OTLP/HTTP in,
# memory storage, the query API and the UI from UI_DIR.
cat >"$work/jaeger.yaml" <<EOF
service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    enable_tracing: false
    storage:
      traces: memstore
    http:
      endpoint: $UI_ADDR
    grpc:
      endpoint: 127.0.0.1:0
    ui:
      assets_path: $(realpath "$UI_DIR")
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 1000
receivers:
  otlp:
    protocols:
      http:
        endpoint: $OTLP_ADDR
processors:
  batch:
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
EOF

if curl -fsS --max-time 2 -o /dev/null "http://$UI_ADDR/" 2>/dev/null; then
	log "something already answers on $UI_ADDR: set JAEGER_LOCAL_UI to a free address"
	exit 1
fi
log "starting $("$JAEGER" version 2>/dev/null | grep -o '"gitVersion":"[^"]*"' || echo jaeger) on $UI_ADDR (OTLP/HTTP on $OTLP_ADDR, UI from $UI_DIR)"
"$JAEGER" --config "$work/jaeger.yaml" >"$work/jaeger.log" 2>&1 &
jaeger_pid=$!
up=
for _ in $(seq 60); do
	if curl -fsS --max-time 2 -o /dev/null "http://$UI_ADDR/api/services" 2>/dev/null; then up=1 && break; fi
	kill -0 "$jaeger_pid" 2>/dev/null || break
	sleep 0.5
done
[ -n "$up" ] || { log "Jaeger did not answer on $UI_ADDR within 30 s"; exit 1; }

log "tenure dev: a scripted failover, its spans exported to http://$OTLP_ADDR"
if ! OTEL_EXPORTER_OTLP_ENDPOINT="http://$OTLP_ADDR" OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf \
	OTEL_EXPORTER_OTLP_TRACES_ENDPOINT= OTEL_TRACES_EXPORTER= OTEL_SDK_DISABLED= OTEL_BSP_SCHEDULE_DELAY=500 \
	timeout --kill-after=10 240 "$TENURE" dev --base-port 0 --records 20 >"$work/dev.log" 2>&1; then
	log "tenure dev failed; its output:"
	tail -n 40 "$work/dev.log"
	exit 1
fi
line=$(grep -o 'trace id: [0-9a-f]\{32\} .*' "$work/dev.log" | head -n 1 || true)
log "the promotion's $line"
case "$line" in
*"(exported to"*) trace_id=$(echo "$line" | awk '{print $3}') ;;
*) log "the promotion's trace was not exported to Jaeger"; exit 1 ;;
esac

# The promoter's spans were delivered before tenure dev said "exported"; the
# replicas' arrive as their processes flush on exit. Wait (bounded) until
# Jaeger's query API holds the fence spans too, so the UI has them to draw.
for _ in $(seq 30); do
	n=$(curl -fsS --max-time 5 "http://$UI_ADDR/api/traces/$trace_id" 2>/dev/null | grep -o '"operationName":"fence"' | wc -l || true)
	[ "$n" -ge 3 ] && break
	sleep 1
done
log "Jaeger's query API holds $n fence spans of trace $trace_id"

deploy/compose/jaeger-ui-check.sh "http://$UI_ADDR" "$trace_id" promote fence-all fence=3
