#!/usr/bin/env bash
# Lock throughput of a 3-node Tenure cluster on loopback, and fail-over time
# (leader killed with SIGKILL → a write succeeds on the new leader).
#
#   bench/cluster.sh                      # 64 clients, 8s per mode
#   CLIENTS=16 DURATION=5s bench/cluster.sh
#
# Starts only its own processes (on free 127.0.0.1 ports) and stops them by PID.
set -euo pipefail
CLIENTS=${CLIENTS:-64}
DURATION=${DURATION:-8s}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TMP=$(mktemp -d)
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$TMP"
}
trap cleanup EXIT
log() { echo "[cluster-bench] $*" >&2; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }

log "building tenure and tenure-bench"
(cd "$ROOT" && go build -o "$TMP/tenure" ./cmd/tenure && go build -o "$TMP/tenure-bench" ./bench/cmd/tenure-bench)
T="$TMP/tenure"

declare -a ADDR PEER
for i in 1 2 3; do ADDR[$i]=127.0.0.1:$(free_port); PEER[$i]=127.0.0.1:$(free_port); done
BOOT="n1=${PEER[1]},n2=${PEER[2]},n3=${PEER[3]}"
EPS="${ADDR[1]},${ADDR[2]},${ADDR[3]}"
declare -A PID_OF
for i in 1 2 3; do
	"$T" serve --http-listen 127.0.0.1:0 --node-id n$i --listen "${ADDR[$i]}" --peer-listen "${PEER[$i]}" --data-dir "$TMP/n$i" \
		--bootstrap-peers "$BOOT" ${TENURE_SERVE_FLAGS:-} >"$TMP/n$i.out" 2>"$TMP/n$i.err" &
	PIDS+=($!)
	PID_OF[n$i]=$!
done
for i in 1 2 3; do
	for _ in $(seq 1 300); do grep -q "serving on" "$TMP/n$i.out" 2>/dev/null && break; sleep 0.1; done
done
for mode in uncontended contended; do
	log "mode=$mode clients=$CLIENTS duration=$DURATION"
	"$TMP/tenure-bench" --endpoint "$EPS" --mode "$mode" --clients "$CLIENTS" --duration "$DURATION" -o json
done

leader=$("$T" --endpoint "$EPS" status -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["leader"])')
log "killing leader $leader (pid ${PID_OF[$leader]})"
start=$(date +%s.%N)
kill -KILL "${PID_OF[$leader]}"
rest=""
for i in 1 2 3; do [[ "n$i" != "$leader" ]] && rest="${rest:+$rest,}${ADDR[$i]}"; done
for _ in $(seq 1 600); do
	if "$T" --endpoint "$rest" fence put failover-probe x --token 1 -o json >/dev/null 2>&1; then break; fi
done
end=$(date +%s.%N)
python3 -c "print('{\"failover_s\": %.3f}' % ($end - $start))"
