# lib.sh: what the compose test scripts (smoke.sh, chaos.sh) share. Sourced,
# after PROJECT and COMPOSE_FILE are set, from the repository root:
#   - COMPOSE: `docker compose` (v2 plugin) when it works, else docker-compose
#     (the Debian package; this machine has only that one);
#   - every service port published on an ephemeral 127.0.0.1 port, so a test
#     project never collides with `make up` or with another test project;
#   - compose: the compose CLI for this project, bounded in time (with
#     COMPOSE_OVERLAY, a second compose file layered over COMPOSE_FILE);
#   - compose_down: remove the project's containers, network and volumes.

if [ -z "${COMPOSE:-}" ]; then
	if docker compose version >/dev/null 2>&1; then COMPOSE="docker compose"; else COMPOSE=docker-compose; fi
fi
for v in LEASE LEASE_2 REPLICA_1 REPLICA_2 REPLICA_3 REPLICA_4 PROMOTER_1 PROMOTER_2 JAEGER OTLP; do
	export "TENURE_PUBLISH_${v}=127.0.0.1:"
done
export TENURE_IMAGE

compose() { timeout --foreground 300 $COMPOSE -p "$PROJECT" -f "$COMPOSE_FILE" ${COMPOSE_OVERLAY:+-f "$COMPOSE_OVERLAY"} "$@"; }

# A short stop timeout first; a second, plain try if that one failed.
compose_down() {
	compose down -v --remove-orphans --timeout 5 >/dev/null 2>&1 ||
		compose down -v --remove-orphans >/dev/null 2>&1
}
