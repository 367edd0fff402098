#!/usr/bin/env bash
# Overhead of a change: the uncontended lock benchmark against two builds
# of tenure, the working tree and BASE (a git revision), each round on a
# fresh server of each, the order alternating from round to round (as
# bench/run.sh alternates Tenure and etcd). The same bench client (the
# working tree's tenure-bench) drives both, unless BENCH_CLIENT=own: then
# each build's own client drives its server (for a change to the client or
# the wire): BASE's bench/cmd/tenure-bench, or for a revision from before
# it, BASE's `tenure bench`.
#
#   BASE=main ROUNDS=10 DURATION=8s bench/overhead.sh
#   BASE=main BENCH_CLIENT=own MODE=contended bench/overhead.sh
#
# Environment:
#   BASE      git revision to compare against            (default main)
#   ROUNDS    rounds, each one run of each build          (default 10)
#   DURATION  measurement window per run                  (default 8s)
#   CLIENTS   concurrent lock clients                     (default 64)
#   MODE      tenure-bench --mode                         (default uncontended)
#   BENCH_CLIENT  tree (the working tree's client) or own  (default tree)
#
# Everything lives in one temp dir under /tmp, removed on exit; only the
# servers this script started are stopped, by PID.
set -euo pipefail

BASE=${BASE:-main}
ROUNDS=${ROUNDS:-10}
DURATION=${DURATION:-8s}
CLIENTS=${CLIENTS:-64}
MODE=${MODE:-uncontended}
BENCH_CLIENT=${BENCH_CLIENT:-tree}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TMP=$(mktemp -d /tmp/tenure-overhead.XXXXXX)
PID=

log() { printf '[overhead] %s\n' "$*" >&2; }
cleanup() {
	local rc=$?
	if [[ -n "$PID" ]]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
	rm -rf "$TMP"
	exit "$rc"
}
trap cleanup EXIT

log "building the working tree and $BASE"
(cd "$ROOT" && go build -buildvcs=false -o "$TMP/new" ./cmd/tenure && go build -buildvcs=false -o "$TMP/new-bench" ./bench/cmd/tenure-bench)
mkdir "$TMP/base-src"
(cd "$ROOT" && git archive "$BASE") | tar -x -C "$TMP/base-src"
(cd "$TMP/base-src" && go build -buildvcs=false -o "$TMP/base" ./cmd/tenure)
# bench_new and bench_base: the bench client of each build, as a command.
bench_new=("$TMP/new-bench")
if [[ -d "$TMP/base-src/bench/cmd/tenure-bench" ]]; then
	(cd "$TMP/base-src" && go build -buildvcs=false -o "$TMP/base-bench" ./bench/cmd/tenure-bench)
	bench_base=("$TMP/base-bench")
else
	bench_base=("$TMP/base" bench) # before the benchmarks left the tenure binary
fi

# run BUILD ROUND: one measurement on a fresh server of BUILD; prints the rate.
run() {
	local bin="$TMP/$1" data="$TMP/data-$1-$2" out="$TMP/serve-$1-$2.out" addr="" extra=()
	if "$bin" serve --help 2>&1 | grep -- --http-listen >/dev/null; then extra=(--http-listen 127.0.0.1:0); fi
	"$bin" serve --data-dir "$data" --listen 127.0.0.1:0 "${extra[@]}" >"$out" 2>"$out.err" &
	PID=$!
	for _ in $(seq 1 300); do
		addr=$(sed -n 's/^tenure: serving on \([0-9.:]*\) .*/\1/p' "$out" 2>/dev/null)
		[[ -n "$addr" ]] && break
		kill -0 "$PID" 2>/dev/null || { cat "$out.err" >&2; exit 1; }
		sleep 0.1
	done
	[[ -n "$addr" ]] || { log "the server did not start"; exit 1; }
	local client=("${bench_new[@]}")
	[[ "$BENCH_CLIENT" == own && "$1" == base ]] && client=("${bench_base[@]}")
	"${client[@]}" --endpoint "$addr" --mode "$MODE" --clients "$CLIENTS" --duration "$DURATION" -o json >"$TMP/bench.json"
	kill "$PID"
	wait "$PID" 2>/dev/null || true
	PID=
	rm -rf "$data"
	local key=ops_per_sec
	[[ "$MODE" == contended ]] && key=handoffs_per_sec
	tr -d '\n ' <"$TMP/bench.json" | grep -o "\"$key\":[0-9.]*" | cut -d: -f2
}

echo "| round | order | $BASE | working tree | ratio |"
echo "| ---: | --- | ---: | ---: | ---: |"
: >"$TMP/ratios"
for round in $(seq 1 "$ROUNDS"); do
	if ((round % 2 == 1)); then
		b=$(run base "$round"); n=$(run new "$round"); order="base first"
	else
		n=$(run new "$round"); b=$(run base "$round"); order="tree first"
	fi
	r=$(awk -v n="$n" -v b="$b" 'BEGIN { printf "%.4f", n / b }')
	echo "$r" >>"$TMP/ratios"
	printf '| %d | %s | %.0f | %.0f | %.3f |\n' "$round" "$order" "$b" "$n" "$r"
done
sort -n "$TMP/ratios" | awk '{ r[NR] = $1 } END { med = (NR % 2) ? r[(NR + 1) / 2] : (r[NR / 2] + r[NR / 2 + 1]) / 2; printf "\nmedian ratio %.3f (min %.3f, max %.3f) over %d rounds\n", med, r[1], r[NR], NR }'
