#!/usr/bin/env bash
# Leader stability of a 3-node Tenure cluster on loopback under CPU load:
# how often leadership changes, with no fault injected, while CPU burners
# (busy shell loops, as `stress --cpu N` runs) compete with the servers.
#
#   bench/leader-stability.sh                       # defaults: 60s idle, then 60s with 8 burners
#   BURNERS="0 4 8" DURATION=60 bench/leader-stability.sh
#   TENURE_SERVE_FLAGS="--heartbeat-timeout 1s --election-timeout 1s --leader-lease-timeout 500ms" bench/leader-stability.sh
#   CLIENTS=64 bench/leader-stability.sh            # and tenure-bench's 64 lock loops against the cluster meanwhile
#
# For each number of burners it starts a fresh cluster, waits until it
# serves, starts the burners, and after DURATION seconds reads from each
# node its tenure_leader_changes_total and term (the change in the term
# counts the elections held; the changes are the new leaders the nodes
# saw). One JSON line per run. Starts only its own processes (on free
# 127.0.0.1 ports) and stops them by PID.
set -euo pipefail
BURNERS=${BURNERS:-"0 8"}
DURATION=${DURATION:-60}
CLIENTS=${CLIENTS:-0}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TMP=$(mktemp -d)
PIDS=()
BURN=()
stop_all() {
	for p in "${BURN[@]}" "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${BURN[@]}" "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
	BURN=()
	PIDS=()
}
cleanup() {
	stop_all
	rm -rf "$TMP"
}
trap cleanup EXIT
log() { echo "[leader-stability] $*" >&2; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }

log "building tenure and tenure-bench"
(cd "$ROOT" && go build -o "$TMP/tenure" ./cmd/tenure && go build -o "$TMP/tenure-bench" ./bench/cmd/tenure-bench)
T="$TMP/tenure"

# metric NAME FILE: the value of an unlabelled metric in an exposition.
metric() { awk -v n="$1" '$1 == n { print $2 }' "$2"; }

for burners in $BURNERS; do
	run="$TMP/run$burners"
	mkdir -p "$run"
	declare -a ADDR PEER HTTP
	for i in 1 2 3; do ADDR[$i]=127.0.0.1:$(free_port); PEER[$i]=127.0.0.1:$(free_port); HTTP[$i]=127.0.0.1:$(free_port); done
	BOOT="n1=${PEER[1]},n2=${PEER[2]},n3=${PEER[3]}"
	for i in 1 2 3; do
		"$T" serve --node-id n$i --listen "${ADDR[$i]}" --peer-listen "${PEER[$i]}" --http-listen "${HTTP[$i]}" --data-dir "$run/n$i" \
			--bootstrap-peers "$BOOT" ${TENURE_SERVE_FLAGS:-} >"$run/n$i.out" 2>"$run/n$i.err" &
		PIDS+=($!)
	done
	for i in 1 2 3; do
		for _ in $(seq 1 300); do grep -q "serving on" "$run/n$i.out" 2>/dev/null && break; sleep 0.1; done
	done
	for i in 1 2 3; do curl -fsS "http://${HTTP[$i]}/metrics" >"$run/before$i"; done
	for _ in $(seq 1 "$burners"); do
		bash -c 'while :; do :; done' &
		BURN+=($!)
	done
	load0=$(cut -d' ' -f1 /proc/loadavg)
	log "burners=$burners clients=$CLIENTS duration=${DURATION}s load=$load0"
	start=$SECONDS
	if (( CLIENTS > 0 )); then
		"$TMP/tenure-bench" --endpoint "${ADDR[1]},${ADDR[2]},${ADDR[3]}" --mode uncontended --clients "$CLIENTS" --duration "${DURATION}s" -o json >"$run/bench.json" 2>"$run/bench.err" || true
	fi
	left=$(( DURATION - (SECONDS - start) ))
	(( left > 0 )) && sleep "$left" # the rest of the measured window (a bench that stopped early), not a synchronisation
	load1=$(cut -d' ' -f1 /proc/loadavg)
	for i in 1 2 3; do curl -fsS "http://${HTTP[$i]}/metrics" >"$run/after$i"; done
	changes=0
	elections=0
	for i in 1 2 3; do
		c=$(( $(metric tenure_leader_changes_total "$run/after$i" | cut -d. -f1) - $(metric tenure_leader_changes_total "$run/before$i" | cut -d. -f1) ))
		e=$(( $(metric tenure_raft_term "$run/after$i" | cut -d. -f1) - $(metric tenure_raft_term "$run/before$i" | cut -d. -f1) ))
		(( c > changes )) && changes=$c
		(( e > elections )) && elections=$e
	done
	bench="null"
	if (( CLIENTS > 0 )); then
		bench=$(python3 -c 'import json,sys
try:
    b = json.load(open(sys.argv[1]))
    print(json.dumps({k: b.get(k) for k in ("ops_per_sec", "p50_ms", "p99_ms", "max_ms", "errors")}))
except Exception:
    err = open(sys.argv[2]).read().strip().splitlines()
    print(json.dumps({"failed": err[-1] if err else "no output"}))' "$run/bench.json" "$run/bench.err")
	fi
	echo "{\"burners\": $burners, \"clients\": $CLIENTS, \"duration_s\": $DURATION, \"leader_changes\": $changes, \"terms\": $elections, \"load_start\": $load0, \"load_end\": $load1, \"flags\": \"${TENURE_SERVE_FLAGS:-}\", \"bench\": $bench}"
	stop_all
done
