#!/usr/bin/env bash
# ports.sh: the host ports of the compose stack (`make up`, `make ctl`).
#
#   ports.sh check PROJECT   before `up`: fail, naming the TENURE_PUBLISH_*
#                            variable that moves it, when a port the stack
#                            would publish is already taken (by a process or
#                            another project), so `up` does not fail half way
#                            with a stack half started. A service of PROJECT
#                            that is already running holds its own port and
#                            is skipped (`make up` twice is fine).
#   ports.sh list PROJECT    after `up`: "SERVICE PORT HOST:PORT" for every
#                            port PROJECT's running containers publish, as
#                            docker bound them (TENURE_PUBLISH_* applied;
#                            0.0.0.0 shown as 127.0.0.1).
#   ports.sh get PROJECT SERVICE PORT
#                            the HOST:PORT SERVICE's PORT is published on;
#                            exit 1 (nothing printed) when it is not.
#
# The published addresses are read from the compose file's
# ${TENURE_PUBLISH_X:-default} entries, so the file stays their one source.
set -euo pipefail
cd "$(dirname "$0")/../.."
COMPOSE_FILE=${COMPOSE_FILE:-deploy/compose/docker-compose.yml}

list() {
	docker ps --filter "label=com.docker.compose.project=$1" \
		--format '{{.Label "com.docker.compose.service"}}|{{.Ports}}' |
		awk -F'|' '{
			n = split($2, p, ", ")
			for (i = 1; i <= n; i++) {
				if (p[i] !~ /->/ || p[i] ~ /^\[?::/) continue # published ones; IPv4 only
				split(p[i], hc, "->"); sub(/\/tcp$/, "", hc[2])
				sub(/^0\.0\.0\.0:/, "127.0.0.1:", hc[1]) # all interfaces: loopback reaches it
				print $1, hc[2], hc[1]
			}
		}' | sort -u
}

# publish: "SERVICE VARIABLE DEFAULT TARGET" for every published port of
# the compose file (services are its two-space-indented keys).
publish() {
	awk '
		/^  [a-z0-9-]+:[[:space:]]*$/ { svc = $1; sub(/:$/, "", svc) }
		/\$\{TENURE_PUBLISH_[A-Z0-9_]+:-[^}]*\}:[0-9]+/ {
			s = $0
			while (match(s, /\$\{TENURE_PUBLISH_[A-Z0-9_]+:-[^}]*\}:[0-9]+/)) {
				m = substr(s, RSTART + 2, RLENGTH - 2); s = substr(s, RSTART + RLENGTH)
				split(m, a, ":-"); split(a[2], b, "}:")
				print svc, a[1], b[1], b[2]
			}
		}' "$COMPOSE_FILE"
}

# taken HOST PORT: something accepts connections there.
taken() { timeout 2 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null; }

check() {
	local project=$1 running bad=0 svc var def target addr host port
	running=$(docker ps --filter "label=com.docker.compose.project=$project" \
		--format '{{.Label "com.docker.compose.service"}}')
	while read -r svc var def target; do
		grep -qx -- "$svc" <<<"$running" && continue
		addr=${!var:-$def}
		case $addr in
		*:*) host=${addr%:*} port=${addr##*:} ;;
		*) host=127.0.0.1 port=$addr ;;
		esac
		case $host in "" | 0.0.0.0) host=127.0.0.1 ;; esac
		# An empty port or 0 is an ephemeral one (the test scripts use those).
		[ -n "$port" ] && [ "$port" != 0 ] || continue
		if taken "$host" "$port"; then
			echo "make up: $host:$port, where $svc's port $target would be published, is taken by something else; set $var=127.0.0.1:PORT to move it (make down if it is another stack of this project, COMPOSE_PROJECT=NAME runs a second one)" >&2
			bad=1
		fi
	done < <(publish)
	return "$bad"
}

case ${1:-} in
check) check "${2:?usage: ports.sh check PROJECT}" ;;
list) list "${2:?usage: ports.sh list PROJECT}" ;;
get)
	[ $# -eq 4 ] || { echo "usage: ports.sh get PROJECT SERVICE PORT" >&2; exit 2; }
	list "$2" | awk -v s="$3" -v p="$4" '$1 == s && $2 == p { print $3; found = 1; exit } END { exit !found }'
	;;
*)
	echo "usage: ports.sh check|list PROJECT, ports.sh get PROJECT SERVICE PORT" >&2
	exit 2
	;;
esac
