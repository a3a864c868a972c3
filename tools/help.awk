# make help: the Makefile's targets grouped (run, test, compose, bench),
# what each builds first (its prerequisites), and the variables that
# change what they do. Reads the Makefiles; a target with a "## " comment
# that no group names is listed under "other", so none is hidden.

BEGIN {
	order = "run test compose bench"
	group["run"] = "build demo tools proto clean"
	group["test"] = "test fmt-check vet lint proto-check gotest chaos-short fuzz chaos jaeger-ui-local"
	group["compose"] = "images up ps ctl stop down compose-smoke chaos-compose jaeger-ui-check"
	group["bench"] = "bench bench-check"
	title["run"] = "Run (a local cluster, no docker)"
	title["test"] = "Test"
	title["compose"] = "Compose (docker; images are built here from source, nothing is pulled)"
	title["bench"] = "Bench"

	vars = "ARGS GOTESTFLAGS TEST_TIMEOUT SEEDS CHAOS_FLAGS FUZZTIME RPC_FUZZTIME FUZZ_MINIMIZE FUZZ_TMPDIR COMPOSE COMPOSE_PROJECT TENURE_PUBLISH_* SMOKE_TIMEOUT CHAOS_COMPOSE_TIMEOUT TRACE_ID JAEGER_URL JAEGER_UI_SPANS TENURE_IMAGE ETCD_IMAGE JAEGER_IMAGE GO"
	vdesc["ARGS"] = "arguments for demo (tenure dev, e.g. ARGS=--keep) and ctl (tenurectl, e.g. ARGS=status)"
	vdesc["GOTESTFLAGS"] = "extra go test flags for gotest, chaos-short, bench-check (e.g. -count=1)"
	vdesc["TEST_TIMEOUT"] = "go test -timeout of the test targets"
	vdesc["SEEDS"] = "chaos: seeded runs of every fault kind"
	vdesc["CHAOS_FLAGS"] = "chaos: extra flags for the chaos test (e.g. -chaos.kinds=...)"
	vdesc["FUZZTIME"] = "fuzz: inputs for the journal decoder"
	vdesc["RPC_FUZZTIME"] = "fuzz: inputs for each RPC fuzz target"
	vdesc["FUZZ_MINIMIZE"] = "fuzz: executions spent minimising each new input"
	vdesc["FUZZ_TMPDIR"] = "fuzz: where the RPC targets' servers keep their data"
	vdesc["COMPOSE"] = "the compose command (docker compose, else docker-compose)"
	vdesc["COMPOSE_PROJECT"] = "the compose project name (its network is NAME_tenure)"
	vdesc["TENURE_PUBLISH_*"] = "up: where a port is published (_LEASE, _LEASE_2, _REPLICA_1.._4, _PROMOTER_1.._2, _JAEGER, _OTLP; e.g. TENURE_PUBLISH_LEASE=127.0.0.1:17000)"
	vdef["TENURE_PUBLISH_*"] = "127.0.0.1: 7000, 7001, 7101-7104, 7201-7202, 16686, 4318"
	vdesc["SMOKE_TIMEOUT"] = "compose-smoke: seconds before it is killed"
	vdesc["CHAOS_COMPOSE_TIMEOUT"] = "chaos-compose: seconds before it is killed"
	vdesc["TRACE_ID"] = "jaeger-ui-check: the trace whose page is loaded"
	vdesc["JAEGER_URL"] = "jaeger-ui-check: the Jaeger UI's base URL"
	vdesc["JAEGER_UI_SPANS"] = "jaeger-ui-check: span names the page must draw (NAME=N: at least N)"
	vdesc["TENURE_IMAGE"] = "the tenure image tag"
	vdesc["ETCD_IMAGE"] = "the etcd image tag"
	vdesc["JAEGER_IMAGE"] = "the Jaeger image tag"
	vdesc["GO"] = "the go command"
}

# name: prerequisites ## description
/^[a-z][a-zA-Z_-]+:.*## / {
	i = index($0, "## ")
	head = substr($0, 1, i - 1)
	c = index(head, ":")
	name = substr(head, 1, c - 1)
	pre = substr(head, c + 1)
	gsub(/\$\(TOOLS\)/, "tools", pre)
	gsub(/\$\(BIN\)\/static\//, "", pre)
	gsub(/\$\(BIN\)\//, "bin/", pre)
	gsub(/^ +| +$/, "", pre)
	if (pre == name) pre = ""
	d[name] = substr($0, i + 3)
	p[name] = pre
	targets[++n] = name
}

# NAME := value, for the defaults that use it
/^[A-Z_]+ :=/ {
	fixed[$1] = $3
}

# NAME ?= default
/^[A-Z_]+ \?=/ {
	v = $1
	def = $0; sub(/^[A-Z_]+ \?= ?/, "", def)
	if (def ~ /^\$\(shell/) def = "found at run time"
	vdef[v] = def
}

function show(t) {
	line = sprintf("  %-16s %s", t, d[t])
	if (p[t] != "") line = line " [first: " p[t] "]"
	print line
	shown[t] = 1
}

END {
	print "Usage: make TARGET [VARIABLE=value ...]"
	ng = split(order, gs, " ")
	for (i = 1; i <= ng; i++) {
		g = gs[i]
		printf "\n%s:\n", title[g]
		nt = split(group[g], ts, " ")
		for (j = 1; j <= nt; j++) if (ts[j] in d) show(ts[j])
	}
	other = 0
	for (i = 1; i <= n; i++) if (!(targets[i] in shown) && targets[i] != "help") {
		if (!other++) printf "\nOther:\n"
		show(targets[i])
	}
	printf "\nVariables (default in brackets):\n"
	nv = split(vars, vs, " ")
	for (i = 1; i <= nv; i++) {
		v = vs[i]
		def = (v in vdef) ? vdef[v] : ""
		for (f in fixed) gsub("\\$\\(" f "\\)", fixed[f], def)
		printf "  %-22s %s [%s]\n", v, vdesc[v], (def == "" ? "none" : def)
		listed[v] = 1
	}
	for (v in vdef) if (!(v in listed)) printf "  %-22s [%s]\n", v, vdef[v]
}
