#!/usr/bin/env bash
# Key-value benchmark: Tenure against etcd, both single-node on loopback,
# both with their default durability (fsync on), both driven by the same
# load (N clients on one connection, each on its own key): put, linearizable
# get, and compare-and-swap txn.
#
#   bench/kv.sh                         # 16 clients, 5s per run
#   CLIENTS=64 DURATION=10s bench/kv.sh
#   ROUNDS=5 bench/kv.sh                # alternating rounds (default 3), median and range
#
# Everything it builds, every data dir and every log lives in one temp dir
# under /tmp, removed on exit. Only the processes this script started are
# stopped, by PID.
set -euo pipefail

CLIENTS=${CLIENTS:-16}
DURATION=${DURATION:-5s}
OPS=${OPS:-"put get txn"}
ROUNDS=${ROUNDS:-3}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TMP=$(mktemp -d /tmp/tenure-kvbench.XXXXXX)
PIDS=()

log() { printf '[kv-bench] %s\n' "$*" >&2; }

cleanup() {
	local rc=$?
	set +e
	for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
	for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null; done
	rm -rf "$TMP"
	exit "$rc"
}
trap cleanup EXIT

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() {
	local p
	for _ in $(seq 1 200); do
		p=$((20000 + RANDOM % 30000))
		if ! port_in_use "$p"; then echo "$p"; return 0; fi
	done
	return 1
}

log "building tenure, tenure-bench, etcd and etcd-kv-bench"
(cd "$ROOT" && go build -buildvcs=false -o "$TMP/tenure" ./cmd/tenure && go build -buildvcs=false -o "$TMP/tenure-bench" ./bench/cmd/tenure-bench)
(cd "$ROOT/bench/etcd" && GOWORK=off go build -buildvcs=false -o "$TMP/etcd-server" ./cmd/etcd-server)
(cd "$ROOT/bench/etcd" && GOWORK=off go build -buildvcs=false -o "$TMP/etcd-kv-bench" ./cmd/etcd-kv-bench)

TEP="127.0.0.1:$(free_port)"
"$TMP/tenure" serve --http-listen 127.0.0.1:0 --data-dir "$TMP/tenure-data" --listen "$TEP" >"$TMP/tenure.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 300); do
	grep -q "serving on" "$TMP/tenure.log" 2>/dev/null && break # printed once it leads
	sleep 0.1
done

ECP=$(free_port)
EPP=$(free_port)
while [[ "$EPP" == "$ECP" ]]; do EPP=$(free_port); done
EEP="127.0.0.1:$ECP"
"$TMP/etcd-server" --name bench --data-dir "$TMP/etcd-data" \
	--listen-client-urls "http://$EEP" --advertise-client-urls "http://$EEP" \
	--listen-peer-urls "http://127.0.0.1:$EPP" --initial-advertise-peer-urls "http://127.0.0.1:$EPP" \
	--initial-cluster "bench=http://127.0.0.1:$EPP" --initial-cluster-state new \
	--log-level warn >"$TMP/etcd.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 300); do
	port_in_use "$ECP" && break
	sleep 0.1
done
sleep 1

for r in $(seq 1 "$ROUNDS"); do
	for op in $OPS; do
		# Alternate which system goes first.
		if ((r % 2)); then order="tenure etcd"; else order="etcd tenure"; fi
		for sys in $order; do
			log "round $r: $op $sys"
			if [[ $sys == tenure ]]; then
				"$TMP/tenure-bench" --endpoint "$TEP" kv --op "$op" --clients "$CLIENTS" --duration "$DURATION" -o json
			else
				"$TMP/etcd-kv-bench" --endpoints "$EEP" --op "$op" --clients "$CLIENTS" --duration "$DURATION"
			fi >"$TMP/$sys-$op.r$r.json"
		done
	done
done

echo "Machine: $(nproc) cores, $(free -g | awk '/^Mem:/{print $2}') GiB RAM, $(uname -sr); tenure $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'); etcd 3.7.3."
echo "$CLIENTS clients, $DURATION per run, $ROUNDS alternating rounds: median (min–max)."
echo
python3 - "$TMP" "$ROUNDS" "$OPS" <<'PY'
import json, statistics, sys
tmp, rounds, ops = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
def runs(sysname, op):
    out = []
    for r in range(1, rounds + 1):
        with open(f"{tmp}/{sysname}-{op}.r{r}.json") as f:
            out.append(json.load(f))
    return out
med = statistics.median
span = lambda xs: f"{med(xs):,.0f} ({min(xs):,.0f}–{max(xs):,.0f})"
print("| op | tenure ops/s | etcd ops/s | tenure / etcd | tenure p50 / p99 ms | etcd p50 / p99 ms |")
print("|---|---|---|---|---|---|")
for op in ops:
    t, e = runs("tenure", op), runs("etcd", op)
    tv, ev = [d["ops_per_sec"] for d in t], [d["ops_per_sec"] for d in e]
    ratio = med([a / b for a, b in zip(tv, ev) if b])
    lat = lambda ds: f"{med([d['p50_ms'] for d in ds]):.2f} / {med([d['p99_ms'] for d in ds]):.2f}"
    print(f"| {op} | {span(tv)} | {span(ev)} | {ratio:.2f}× | {lat(t)} | {lat(e)} |")
PY
