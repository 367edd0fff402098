#!/usr/bin/env bash
# Queue at scale: one durable node, a queue of ITEMS stored items (100-byte
# payloads), batch throughput with that many stored, the server's memory
# per item, then a restart of the server to its first answered read.
#
#   bench/queue.sh                                # 10,000,000 items, batches of 100
#   ITEMS=1000000 BATCH=10 DURATION=10s bench/queue.sh
#   ROUNDS=3 bench/queue.sh                       # three restarts
#
# Steps: build tenure and tenure-bench; serve on a fresh data dir;
# `tenure-bench queue
# --stored ITEMS --batch BATCH` (prefill in batches of 1,000, then
# PRODUCERS producers and CONSUMERS consumers for DURATION); the peer, the
# single-item requests (16 + 16 clients on a queue of its own, the ITEMS
# still stored) on the same server right after; read the
# server's RSS and Go heap; stop it (SIGTERM) and start it again ROUNDS
# times, each time timing `tenure queue len` until it answers, with the
# phases the server logs. Everything lives in one temp dir under /tmp,
# removed on exit (KEEP_TMP=1 keeps it); only the processes this script
# started are stopped, by PID.
set -euo pipefail

ITEMS=${ITEMS:-10000000}
BATCH=${BATCH:-100}
PRODUCERS=${PRODUCERS:-4}
CONSUMERS=${CONSUMERS:-4}
DURATION=${DURATION:-30s}
ROUNDS=${ROUNDS:-1}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TMP=$(mktemp -d /tmp/tenure-queuebench.XXXXXX)
PID=""

log() { printf '[queue-bench] %s\n' "$*" >&2; }

cleanup() {
	local rc=$?
	set +e
	[[ -n "$PID" ]] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
	[[ "${KEEP_TMP:-}" == 1 ]] && log "kept $TMP" || rm -rf "$TMP"
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

EP="127.0.0.1:$(free_port)"
HTTP="127.0.0.1:$(free_port)"
serve() { # log file
	"$TMP/tenure" serve --data-dir "$TMP/data" --listen "$EP" --http-listen "$HTTP" \
		--max-queue-length $((ITEMS + 1000000)) >"$1" 2>&1 &
	PID=$!
}
stop() {
	kill -TERM "$PID"
	wait "$PID" 2>/dev/null || true
	PID=""
}
memory() { # prints: rss_bytes heap_live_bytes
	local rss goal
	rss=$(python3 -c 'import sys; print(next(int(l.split()[1]) * 1024 for l in open(sys.argv[1]) if l.startswith("VmRSS:")))' "/proc/$PID/status")
	# The heap goal is twice the heap live after the last GC (GOGC=100).
	goal=$(curl -s "http://$HTTP/metrics" | python3 -c 'import sys; print(next(int(float(l.split()[1])) for l in sys.stdin if l.startswith("go_memstats_next_gc_bytes ")))')
	echo "$rss $((goal / 2))"
}
field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$@"; }

log "building tenure and tenure-bench"
(cd "$ROOT" && go build -buildvcs=false -o "$TMP/tenure" ./cmd/tenure && go build -buildvcs=false -o "$TMP/tenure-bench" ./bench/cmd/tenure-bench)
serve "$TMP/serve-0.log"
for _ in $(seq 1 300); do
	grep -q "serving on" "$TMP/serve-0.log" 2>/dev/null && break
	sleep 0.1
done

log "filling $ITEMS items and measuring batches of $BATCH"
"$TMP/tenure-bench" --endpoint "$EP" queue --stored "$ITEMS" --batch "$BATCH" --producers "$PRODUCERS" \
	--consumers "$CONSUMERS" --duration "$DURATION" -o json >"$TMP/bench.json"
Q=$(field "$TMP/bench.json" queue)
read -r RSS HEAP < <(memory)
STORED=$(field "$TMP/bench.json" stored_after)
log "the peer: single-item requests, 16 producers and 16 consumers, on the same server"
"$TMP/tenure-bench" --endpoint "$EP" queue --stored 1000 --batch 1 --producers 16 --consumers 16 \
	--duration "$DURATION" -o json >"$TMP/peer.json"

echo "Machine: $(nproc) cores, $(free -g | awk '/^Mem:/{print $2}') GiB RAM, $(uname -sr), load $(cut -d' ' -f1-3 /proc/loadavg)."
echo
echo "| stored in its queue | batch | producers + consumers | items/s | enqueue p50 / p99 ms | dequeue p50 / p99 ms | ack p50 / p99 ms | prefill items/s |"
echo "|---|---|---|---|---|---|---|---|"
python3 - "$TMP/bench.json" "$TMP/peer.json" <<'EOF'
import json, sys
for path in sys.argv[1:]:
    b = json.load(open(path))
    print(f"| {b['stored_before']:,} | {b['batch']} | {b['producers']} + {b['consumers']} | {b['items_per_sec']:,.0f} | "
          f"{b['enqueue_p50_ms']:.1f} / {b['enqueue_p99_ms']:.1f} | {b['dequeue_p50_ms']:.1f} / {b['dequeue_p99_ms']:.1f} | "
          f"{b['ack_p50_ms']:.1f} / {b['ack_p99_ms']:.1f} | {b['prefill_per_sec']:,.0f} |")
EOF
echo
echo "| when | items stored | RSS | RSS per item | live heap | live heap per item | heap per item beyond the 100-byte payload |"
echo "|---|---|---|---|---|---|---|"
row() { # when rss heap
	python3 -c "import sys; w,r,h,n=sys.argv[1],int(sys.argv[2]),int(sys.argv[3]),int(sys.argv[4]); print(f'| {w} | {n:,} | {r/2**20:,.0f} MiB | {r/n:.0f} B | {h/2**20:,.0f} MiB | {h/n:.0f} B | {h/n-100:.0f} B |')" "$@" "$STORED"
}
row "after the run" "$RSS" "$HEAP"

RESTARTS=()
for round in $(seq 1 "$ROUNDS"); do
	stop
	t0=$(date +%s%N)
	serve "$TMP/serve-$round.log"
	until "$TMP/tenure" --endpoint "$EP" queue len "$Q" -o json >"$TMP/len.json" 2>/dev/null; do sleep 0.02; done
	t1=$(date +%s%N)
	cpu=$(python3 -c 'import os,sys; f=open(sys.argv[1]).read().rsplit(")",1)[1].split(); print(int((int(f[11])+int(f[12]))*1000/os.sysconf("SC_CLK_TCK")))' "/proc/$PID/stat")
	[[ $(field "$TMP/len.json" queued) -gt 0 ]] || { log "the queue is empty after the restart"; exit 1; }
	RESTARTS+=("$(( (t1 - t0) / 1000000 )) $cpu $(cut -d' ' -f1 /proc/loadavg) $TMP/serve-$round.log")
done
read -r RSS HEAP < <(memory)
row "after a restart" "$RSS" "$HEAP"
echo
echo "| restart | load | first read ms | server CPU ms | open ms | raft start (snapshot restore) ms | log check ms | replay and election ms | snapshot index | log entries replayed |"
echo "|---|---|---|---|---|---|---|---|---|---|"
i=0
for r in "${RESTARTS[@]}"; do
	i=$((i + 1))
	set -- $r
	python3 - "$1" "$2" "$3" "$4" "$i" <<'EOF'
import re, sys
ms, cpu, load, path, i = sys.argv[1:6]
text = open(path).read()
def attr(msg, key):
    m = re.search(r'msg="?' + re.escape(msg) + r'"?[^\n]*?\b' + key + r'=(\d+)', text)
    return m.group(1) if m else "–"
print(f"| {i} | {load} | {ms} | {cpu} | {attr('data directory opened', 'ms')} | {attr('data directory opened', 'snapshot_restore_ms')} | "
      f"{attr('data directory opened', 'log_check_ms')} | {attr('ready', 'ms_since_open')} | "
      f"{attr('data directory opened', 'snapshot_index')} | {attr('ready', 'log_entries_applied')} |")
EOF
done
