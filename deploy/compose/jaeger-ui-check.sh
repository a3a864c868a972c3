#!/usr/bin/env bash
# jaeger-ui-check.sh: prove Jaeger's real UI draws a trace, in a real browser.
#
#   deploy/compose/jaeger-ui-check.sh JAEGER_URL TRACE_ID SPAN[=N]...
#   e.g. deploy/compose/jaeger-ui-check.sh http://127.0.0.1:16686 4bf92f3577b34da6a3ce929d0e0e4736 promote fence=3
#
# Loads JAEGER_URL/trace/TRACE_ID in headless chromium, lets the single-page
# app fetch the trace from Jaeger's query API and render it, and checks the
# rendered page's span tree has a row for every SPAN (its operation name; =N:
# at least N rows). Saves a screenshot (JAEGER_UI_SCREENSHOT, default
# bin/jaeger-trace.png) and the rendered DOM next to it (.html). Used by
# `make compose-smoke` after the promotion and by `make jaeger-ui-check`,
# which points it at any Jaeger (e.g. a local one).
#
# Exit status: 0 the trace is drawn; 1 it is not (the reason is printed);
# 2 usage; 3 no chromium to run (the check did NOT run: callers must not
# count that as a pass). Every step is bounded in time (JAEGER_UI_TIMEOUT
# seconds per browser run, default 90).
#
# Env: CHROMIUM (default: chromium, then chromium-browser, on PATH),
# JAEGER_UI_SCREENSHOT, JAEGER_UI_TIMEOUT, JAEGER_UI_BUDGET_MS (the browser's
# virtual-time budget for the app to render, default 15000).
set -euo pipefail

log() { printf 'jaeger-ui-check: %s\n' "$*"; }
if [ "$#" -lt 3 ]; then
	echo "usage: $0 JAEGER_URL TRACE_ID SPAN[=N]..." >&2
	exit 2
fi
base=${1%/}
trace_id=$2
shift 2
[[ "$trace_id" =~ ^[0-9a-f]{1,32}$ ]] || { log "not a trace id (1-32 lowercase hex digits): '$trace_id'"; exit 2; }
shot=${JAEGER_UI_SCREENSHOT:-bin/jaeger-trace.png}
bound=${JAEGER_UI_TIMEOUT:-90}
budget=${JAEGER_UI_BUDGET_MS:-15000}
url="$base/trace/$trace_id"

browser=${CHROMIUM:-}
if [ -z "$browser" ]; then
	for b in chromium chromium-browser; do
		if command -v "$b" >/dev/null 2>&1; then browser=$b && break; fi
	done
fi
if [ -z "$browser" ] || ! command -v "$browser" >/dev/null 2>&1; then
	log "UNAVAILABLE: no chromium to run (${browser:-neither chromium nor chromium-browser} on PATH; Debian: apt-get install chromium): the trace page was NOT checked"
	exit 3
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$(dirname "$shot")"

# Before the browser: Jaeger must serve the real UI's page for the trace's
# path (the single-page app's route), not the placeholder a Jaeger built
# without assets serves. Plain HTTP, so a failure here says which it is.
if ! timeout 20 curl -fsS --max-time 15 -o "$work/page.html" "$url"; then
	log "FAIL: GET $url did not answer 200"
	exit 1
fi
if ! grep -q 'id="jaeger-ui-root"' "$work/page.html"; then
	log "FAIL: $url is not jaeger-ui's page (no jaeger-ui-root element): Jaeger serves its placeholder? (extensions.jaeger_query.ui.assets_path)"
	head -c 600 "$work/page.html"
	echo
	exit 1
fi
version=$(grep -o '"gitVersion":"[^"]*"' "$work/page.html" | head -n 1 || true)
log "Jaeger serves jaeger-ui at $url (${version:-no version injected})"

# chromium runs as root in CI: its sandbox needs an unprivileged user, so it
# is off there (the page is our own Jaeger's). Its own profile directory, so
# runs never share state, and no first-run, extension or update traffic.
flags=(--headless=new --disable-gpu --disable-dev-shm-usage --hide-scrollbars --no-first-run
	--no-default-browser-check --disable-extensions --disable-background-networking --disable-sync
	--user-data-dir="$work/profile" --window-size=1400,1000 --virtual-time-budget="$budget")
[ "$(id -u)" -ne 0 ] || flags+=(--no-sandbox)

log "rendering $url in $($browser --version 2>/dev/null || echo "$browser") (budget ${budget} ms virtual time)"
if ! timeout --kill-after=10 "$bound" "$browser" "${flags[@]}" --dump-dom "$url" >"$work/dom.html" 2>"$work/chromium.log"; then
	log "FAIL: chromium did not render $url within ${bound}s; its log:"
	tail -n 20 "$work/chromium.log"
	exit 1
fi
cp "$work/dom.html" "${shot%.png}.html"
if ! timeout --kill-after=10 "$bound" "$browser" "${flags[@]}" --screenshot="$shot" "$url" >/dev/null 2>>"$work/chromium.log" || [ ! -s "$shot" ]; then
	log "FAIL: chromium took no screenshot of $url within ${bound}s; its log:"
	tail -n 20 "$work/chromium.log"
	exit 1
fi
log "screenshot: $shot, rendered DOM: ${shot%.png}.html"

# The rendered span tree: every span row's operation name is the text of a
# <small class="endpoint-name"> (jaeger-ui's SpanBarRow). Matching that
# element, not just the word, keeps "promote" from matching the service
# name "promoter-1", and the page's own script text from matching anything.
grep -o '<small class="endpoint-name">[^<]*</small>' "$work/dom.html" |
	sed -e 's/<[^>]*>//g' >"$work/ops" || true
rows=$(wc -l <"$work/ops")
if [ "$rows" -eq 0 ]; then
	# The page's text without its scripts and styles: jaeger-ui's error
	# (e.g. "HTTP Error: trace ... not found", Status 404) when it has one.
	log "FAIL: the rendered page has no span rows for trace $trace_id; its text:"
	perl -0pe 's/<(script|style)\b.*?<\/\1>//gs; s/<!--.*?-->//gs; s/<[^>]*>/ /g; s/\s+/ /g' "$work/dom.html" | head -c 600
	echo
	exit 1
fi
# jaeger-ui's trace header shows the trace id's first 7 digits: the page
# drawn is this trace, not another.
short=${trace_id:0:7}
if ! grep -q ">$short<\|>$short \| $short<" "$work/dom.html"; then
	log "FAIL: the rendered page does not show trace id $short..."
	exit 1
fi
fail=0
for want in "$@"; do
	name=${want%%=*}
	min=1
	[ "$name" = "$want" ] || min=${want#*=}
	n=$(grep -cxF -- "$name" "$work/ops" || true)
	if [ "$n" -lt "$min" ]; then
		log "FAIL: the span tree shows $n '$name' span(s), want at least $min"
		fail=1
	else
		log "ok: the span tree shows $n '$name' span(s)"
	fi
done
if [ "$fail" -ne 0 ]; then
	log "the span tree's $rows rows: $(sort "$work/ops" | uniq -c | tr -s ' \n' ' ')"
	exit 1
fi
log "PASS: the real Jaeger UI draws trace $trace_id ($rows span rows)"
