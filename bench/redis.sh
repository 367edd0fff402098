#!/usr/bin/env bash
# One client, one lock: Tenure's lock+unlock cycle against the usual Redis
# lock recipe (SET NX PX, then a compare-and-delete script) on a Redis with
# appendonly yes and appendfsync always, both single-node on loopback, in
# the same run, rounds alternating which system goes first.
#
#   bench/redis.sh                         # 1 client, 5 s per run, 3 rounds
#   ROUNDS=5 DURATION=8s bench/redis.sh
#   TENURE_SERVE_FLAGS="--log-store bolt" bench/redis.sh
#
# Environment:
#   CLIENTS   concurrent clients, each locking a name of its own (default 1)
#   DURATION  measurement window per run                          (default 5s)
#   ROUNDS    rounds; the order of the two systems alternates     (default 3)
#   TENURE_SERVE_FLAGS extra flags for `tenure serve`
#   KEEP_TMP=1 keep the temp dir (binaries, data, logs)
#
# It needs redis-server on PATH (Debian: apt-get install redis-server). All
# it builds and every data dir live in one temp dir under /tmp, removed on
# exit; only the processes it started are stopped, by PID.
set -euo pipefail

CLIENTS=${CLIENTS:-1}
DURATION=${DURATION:-5s}
ROUNDS=${ROUNDS:-3}
KEEP_TMP=${KEEP_TMP:-0}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TMP=$(mktemp -d /tmp/tenure-redis-bench.XXXXXX)
PIDS=()
log() { printf '[bench] %s\n' "$*" >&2; }
cleanup() {
	local rc=$?
	set +e
	for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
	for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null; done
	if [[ "$KEEP_TMP" == 1 ]]; then log "kept $TMP"; else rm -rf "$TMP"; fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

command -v redis-server >/dev/null || { log "redis-server not found (apt-get install redis-server)"; exit 1; }
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() {
	local p
	for _ in $(seq 1 200); do
		p=$((20000 + RANDOM % 30000))
		if ! port_in_use "$p"; then echo "$p"; return 0; fi
	done
	return 1
}
field() { tr -d '\n\r\t ' <"$1" | grep -o -E "\"$2\":[-+0-9.eE]+" | head -n 1 | sed -E "s/^\"$2\"://"; }

log "building tenure, tenure-bench and redis-lock-bench in $TMP"
(cd "$ROOT" && go build -buildvcs=false -o "$TMP/tenure" ./cmd/tenure && go build -buildvcs=false -o "$TMP/tenure-bench" ./bench/cmd/tenure-bench)
(cd "$ROOT/bench/redis" && GOWORK=off go build -buildvcs=false -o "$TMP/redis-lock-bench" ./cmd/redis-lock-bench)

TPORT=$(free_port)
"$TMP/tenure" serve --http-listen "" --data-dir "$TMP/tenure-data" --listen "127.0.0.1:$TPORT" ${TENURE_SERVE_FLAGS:-} >"$TMP/tenure.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 300); do
	grep -q "serving on" "$TMP/tenure.log" 2>/dev/null && break
	sleep 0.1
done
grep -q "serving on" "$TMP/tenure.log" || { log "tenure did not start:"; cat "$TMP/tenure.log" >&2; exit 1; }

RPORT=$(free_port)
mkdir -p "$TMP/redis"
redis-server --port "$RPORT" --bind 127.0.0.1 --dir "$TMP/redis" --appendonly yes --appendfsync always \
	--save "" --daemonize no --logfile "$TMP/redis.log" &
PIDS+=($!)
for _ in $(seq 1 100); do
	port_in_use "$RPORT" && break
	sleep 0.1
done

run_tenure() { "$TMP/tenure-bench" --endpoint "127.0.0.1:$TPORT" -o json --mode uncontended --clients "$CLIENTS" --duration "$DURATION" >"$1"; }
run_redis() { "$TMP/redis-lock-bench" --addr "127.0.0.1:$RPORT" --clients "$CLIENTS" --duration "$DURATION" >"$1"; }

echo "| round | Tenure cycles/s (p50 lock ms) | Redis cycles/s (p50 lock ms) | Tenure / Redis |"
echo "|---:|---:|---:|---:|"
ratios=()
for r in $(seq 1 "$ROUNDS"); do
	if (( r % 2 )); then run_tenure "$TMP/t$r.json"; run_redis "$TMP/r$r.json"; else run_redis "$TMP/r$r.json"; run_tenure "$TMP/t$r.json"; fi
	t=$(field "$TMP/t$r.json" ops_per_sec); rd=$(field "$TMP/r$r.json" ops_per_sec)
	tp=$(field "$TMP/t$r.json" p50_ms); rp=$(field "$TMP/r$r.json" p50_ms)
	ratio=$(awk -v a="$t" -v b="$rd" 'BEGIN { printf "%.2f", a / b }')
	ratios+=("$ratio")
	printf '| %d | %.0f (%s) | %.0f (%s) | %s× |\n' "$r" "$t" "$tp" "$rd" "$rp" "$ratio"
done
median=$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }')
echo "median Tenure / Redis: ${median}×"
