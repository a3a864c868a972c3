#!/usr/bin/env bash
# chaos.sh: container chaos (`make chaos-compose`). Brings up its own compose
# project (CHAOS_PROJECT, default tenurechaos; ports published on ephemeral
# 127.0.0.1 ports, so it collides neither with `make up` nor with the smoke
# test) and runs the chaos driver (deploy/compose/chaos, bin/static/chaos)
# on the host against it. The driver runs the scenarios one after the other,
# each on a range of its own with the workload running before and during the
# fault: kill the leader; docker pause the leader past its lease, then
# unpause; disconnect the leader from the network, then reconnect; stop two
# of three replicas together, then start them; corrupt or truncate a stopped
# follower's journal; docker pause the lease services for 1.1-2.5 x the
# lease TTL; replace a member (sometimes the leader) with the idle fourth
# replica through `tenurectl range replace-replica`; docker kill the lease
# instance the leader renews through, then the leader (kill-lease), and the
# same with an etcd member (kill-etcd-member): the range must go on
# acknowledging appends through the surviving instances, and be promoted
# through them; take the free space of replica-3's disk (a tmpfs of the
# host's, mounted here as root: docker-compose.diskfull.yml) below its
# reserve, then give it back (disk-full): appends refused, nothing lost,
# resumed without a restart. After healing, each range must serve again within the liveness
# bound, with the promoter's view agreeing (the stuck column). It reads
# the final state through tenurectl, checks every run with
# internal/chaos/check and ends with the scoreboard. The
# stack is ALWAYS torn down with its volumes, also on failure or
# interruption. Every wait is bounded.
#
# Why the driver runs on the host, not in the network like the smoke client:
# the faults are docker operations, and the workload does not need the
# replicas' advertised (compose) addresses; it dials each replica's
# published port (see deploy/compose/chaos/main.go).
#
# Needs: the images (`make images`), bin/static/chaos and the host tenurectl
# bin/static/tenurectl (`make chaos-compose` builds all of them).
#   CHAOS_SEED=N        reproduce a run's choices (printed at the start and end)
#   CHAOS_SCENARIOS=a,b run only these (kill-leader, pause-leader,
#                       disconnect-leader, restart-majority, corrupt-journal,
#                       pause-lease, replace-replica, kill-lease,
#                       kill-etcd-member, disk-full; disk-full needs root,
#                       to mount replica-3's tmpfs, and is skipped, saying
#                       so, without it)
#   CHAOS_DISKFULL_SIZE=256m  the size of that tmpfs
#   CHAOS_KEEP_LOGS=1   print every container's log tail also on success
set -euo pipefail
cd "$(dirname "$0")/../.."

PROJECT=${CHAOS_PROJECT:-tenurechaos}
COMPOSE_FILE=deploy/compose/docker-compose.yml
CHAOS_BIN=$(realpath "${CHAOS_BIN:-bin/static/chaos}")
# The stack runs mutual TLS: the driver and tenurectl use the operator's
# certificate (make compose-certs; the Makefile exports the path).
CERTS=$(realpath "${TENURE_CERTS_DIR:-bin/compose-certs}")
[ -f "$CERTS/ca.pem" ] || { echo "chaos.sh: no certificates in $CERTS (make compose-certs makes them)" >&2; exit 2; }
export TENURE_CERTS_DIR=$CERTS
TENURECTL=$(realpath "${CHAOS_TENURECTL:-bin/static/tenurectl}")
for f in "$CHAOS_BIN" "$TENURECTL"; do
	[ -f "$f" ] && [ -x "$f" ] || { echo "chaos.sh: no executable $f (make chaos-compose builds it)" >&2; exit 2; }
done
SEED=${CHAOS_SEED:-0}
if [ "$SEED" = 0 ]; then SEED=$(( ($(date +%s%N) / 1000) % 1000000000 + 1 )); fi
ALL_SCENARIOS=kill-leader,pause-leader,disconnect-leader,restart-majority,corrupt-journal,pause-lease,replace-replica,kill-lease,kill-etcd-member,disk-full
SCENARIOS=${CHAOS_SCENARIOS:-$ALL_SCENARIOS}
# A misspelt name fails here, not after the stack is up and its logs dumped
# (the driver, deploy/compose/chaos, knows the same list and checks again).
for s in ${SCENARIOS//,/ }; do
	case ",$ALL_SCENARIOS," in
	*,"$s",*) ;;
	*) echo "chaos.sh: unknown scenario '$s' in CHAOS_SCENARIOS (known: $ALL_SCENARIOS)" >&2; exit 2 ;;
	esac
done
TENURE_IMAGE=${TENURE_IMAGE:-tenure/tenure:dev}
. deploy/compose/lib.sh

work=$(mktemp -d)
t0=$SECONDS
log() { printf '[chaos.sh %4ds] %s\n' "$((SECONDS - t0))" "$*"; }

# disk-full: replica-3's /data is a tmpfs of a fixed size mounted here (the
# host's mount namespace is the Docker engine's), bound into the container
# by docker-compose.diskfull.yml; the driver fills it from the host.
diskdir=
driver_disk=()
case ",$SCENARIOS," in
*,disk-full,*)
	diskdir=$work/replica-3-data
	mkdir -p "$diskdir"
	if [ "$(id -u)" = 0 ] && mount -t tmpfs -o "size=${CHAOS_DISKFULL_SIZE:-256m}" tenure-chaos-disk "$diskdir"; then
		export TENURE_DISKFULL_DIR=$diskdir
		COMPOSE_OVERLAY=deploy/compose/docker-compose.diskfull.yml
		driver_disk=(--disk-full-dir "$diskdir")
	else
		log "SKIPPING disk-full: mounting a tmpfs for replica-3's data needs root"
		diskdir=
		SCENARIOS=$(printf '%s' ",$SCENARIOS," | sed 's/,disk-full,/,/; s/^,//; s/,$//')
	fi
	;;
esac

teardown() {
	local rc=$?
	trap - EXIT INT TERM
	set +e
	if [ "$rc" -ne 0 ] || [ -n "${CHAOS_KEEP_LOGS:-}" ]; then
		log "exit $rc; container states and recent logs:"
		compose ps
		compose logs --no-color --tail 40 2>&1 | tail -n 400
	fi
	# A paused container cannot be stopped: unpause any the driver left.
	docker ps -q --filter "label=com.docker.compose.project=$PROJECT" --filter status=paused | xargs -r docker unpause >/dev/null
	log "tearing down ${PROJECT} (containers, network, volumes)"
	compose_down
	# The tmpfs goes only once no container holds it (after the down).
	if [ -n "$diskdir" ]; then umount "$diskdir" || umount -l "$diskdir"; fi
	rm -rf "$work"
	if [ "$rc" -eq 0 ]; then log "PASS (project $PROJECT, seed $SEED, $((SECONDS - t0))s)"; else log "FAIL (project $PROJECT, seed $SEED, $((SECONDS - t0))s)"; fi
	exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

log "compose: $COMPOSE; project $PROJECT; seed $SEED; removing any leftover stack"
compose down -v --remove-orphans >/dev/null 2>&1 || true

log "starting the stack"
compose up -d
COMPOSE="$COMPOSE" timeout --foreground 300 deploy/compose/wait-healthy.sh "$PROJECT" 240

log "running the chaos driver ($SCENARIOS)"
# The driver bounds each of its waits; this bounds the whole.
timeout --foreground --kill-after=30 "${CHAOS_DRIVER_TIMEOUT:-1500}" \
	"$CHAOS_BIN" --project "$PROJECT" --tenurectl "$TENURECTL" --work "$work" --seed "$SEED" --scenarios "$SCENARIOS" "${driver_disk[@]}" \
	--cacert "$CERTS/ca.pem" --cert "$CERTS/operator.pem" --key "$CERTS/operator-key.pem"
