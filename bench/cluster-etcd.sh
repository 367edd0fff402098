#!/usr/bin/env bash
# Three-node clusters compared: Tenure against etcd 3.7.3, both with three
# voters on loopback, default durability (fsync on every node), driven in
# the same run by the same load:
#
#   locks uncontended   CLIENTS clients, each locking and unlocking its own
#                       name (tenure-bench / etcd's concurrency.Mutex)
#   locks contended     CLIENTS clients on one name, hold time zero
#   kv put, kv get      KV_CLIENTS clients, each on its own key; get is
#                       linearizable on both
#
# Rounds alternate between the systems; the table gives each figure's
# median and its range over the rounds, and the median ratio.
#
#   bench/cluster-etcd.sh                         # 64 clients, 8s per run, 3 rounds
#   ROUNDS=5 DURATION=10s bench/cluster-etcd.sh
#   KEEP_TMP=1 bench/cluster-etcd.sh              # keep logs and raw JSON
#   TENURE_SERVE_FLAGS="--log-store bolt" bench/cluster-etcd.sh  # Tenure on raft-boltdb
#
# Every client is given all three endpoints. Everything it builds and every
# data dir lives in one temp dir under /tmp; only the processes this script
# started are stopped, by PID.
set -euo pipefail

CLIENTS=${CLIENTS:-64}
KV_CLIENTS=${KV_CLIENTS:-16}
DURATION=${DURATION:-8s}
ROUNDS=${ROUNDS:-3}
if ! [[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]]; then
	echo "ROUNDS must be a positive integer, not '$ROUNDS'" >&2
	exit 2
fi

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TMP=$(mktemp -d /tmp/tenure-cluster-etcd.XXXXXX)
PIDS=()
log() { printf '[cluster-etcd] %s\n' "$*" >&2; }
cleanup() {
	local rc=$?
	set +e
	for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
	for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null; done
	if [[ -n "${KEEP_TMP:-}" ]]; then log "kept $TMP"; else rm -rf "$TMP"; fi
	exit "$rc"
}
trap cleanup EXIT

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
declare -A TAKEN
free_port() {
	local p
	for _ in $(seq 1 200); do
		p=$((20000 + RANDOM % 30000))
		if [[ -z "${TAKEN[$p]:-}" ]] && ! port_in_use "$p"; then TAKEN[$p]=1; echo "$p"; return 0; fi
	done
	return 1
}

log "building tenure, tenure-bench, etcd-server, etcd-bench and etcd-kv-bench"
(cd "$ROOT" && go build -buildvcs=false -o "$TMP/tenure" ./cmd/tenure && go build -buildvcs=false -o "$TMP/tenure-bench" ./bench/cmd/tenure-bench)
for c in etcd-server etcd-bench etcd-kv-bench; do
	(cd "$ROOT/bench/etcd" && GOWORK=off go build -buildvcs=false -o "$TMP/$c" "./cmd/$c")
done
T="$TMP/tenure"

# Tenure: three voters.
declare -a TADDR TPEER THTTP
for i in 1 2 3; do TADDR[$i]=127.0.0.1:$(free_port); TPEER[$i]=127.0.0.1:$(free_port); THTTP[$i]=127.0.0.1:$(free_port); done
TBOOT="n1=${TPEER[1]},n2=${TPEER[2]},n3=${TPEER[3]}"
TEPS="${TADDR[1]},${TADDR[2]},${TADDR[3]}"
for i in 1 2 3; do
	"$T" serve --http-listen "${THTTP[$i]}" --node-id "n$i" --listen "${TADDR[$i]}" --peer-listen "${TPEER[$i]}" \
		--data-dir "$TMP/tenure-n$i" --bootstrap-peers "$TBOOT" ${TENURE_SERVE_FLAGS:-} >"$TMP/tenure-n$i.out" 2>"$TMP/tenure-n$i.err" &
	PIDS+=($!)
done
"$T" --endpoint "$TEPS" status --wait 30s >/dev/null

# etcd: three members.
declare -a ECLI EPEER
for i in 1 2 3; do ECLI[$i]=127.0.0.1:$(free_port); EPEER[$i]=127.0.0.1:$(free_port); done
ECLUSTER="e1=http://${EPEER[1]},e2=http://${EPEER[2]},e3=http://${EPEER[3]}"
EEPS="${ECLI[1]},${ECLI[2]},${ECLI[3]}"
for i in 1 2 3; do
	"$TMP/etcd-server" --name "e$i" --data-dir "$TMP/etcd-e$i" \
		--listen-client-urls "http://${ECLI[$i]}" --advertise-client-urls "http://${ECLI[$i]}" \
		--listen-peer-urls "http://${EPEER[$i]}" --initial-advertise-peer-urls "http://${EPEER[$i]}" \
		--initial-cluster "$ECLUSTER" --initial-cluster-state new --initial-cluster-token tenure-bench \
		--log-level warn >"$TMP/etcd-e$i.log" 2>&1 &
	PIDS+=($!)
done
for _ in $(seq 1 300); do
	# A put that succeeds means the cluster has a leader and a quorum.
	if "$TMP/etcd-kv-bench" --endpoints "${ECLI[1]}" --op put --clients 1 --duration 100ms >/dev/null 2>&1; then break; fi
	sleep 0.1
done

# scrape NAME: the log-append and commit metrics of every Tenure node, for
# the "where the time goes" table.
scrape() {
	for i in 1 2 3; do
		curl -fsS "http://${THTTP[$i]}/metrics" | grep -E '^tenure_(log_append_seconds_(sum|count)|raft_is_leader|apply_batch_commands_(sum|count)) ' | sed "s/^/n$i /"
	done >"$TMP/metrics-$1.txt"
}
run_tenure() { # scenario round
	if [[ $1 == contended && $2 == 1 ]]; then scrape before; fi
	case $1 in
	uncontended | contended) "$TMP/tenure-bench" --endpoint "$TEPS" --mode "$1" --clients "$CLIENTS" --duration "$DURATION" -o json ;;
	put | get) "$TMP/tenure-bench" --endpoint "$TEPS" kv --op "$1" --clients "$KV_CLIENTS" --duration "$DURATION" -o json ;;
	esac >"$TMP/tenure-$1.r$2.json"
	if [[ $1 == contended && $2 == 1 ]]; then scrape after; fi
}
run_etcd() {
	case $1 in
	uncontended | contended) "$TMP/etcd-bench" --endpoints "$EEPS" --mode "$1" --clients "$CLIENTS" --duration "$DURATION" -o json ;;
	put | get) "$TMP/etcd-kv-bench" --endpoints "$EEPS" --op "$1" --clients "$KV_CLIENTS" --duration "$DURATION" ;;
	esac >"$TMP/etcd-$1.r$2.json"
}

SCENARIOS="uncontended contended put get"
for r in $(seq 1 "$ROUNDS"); do
	for s in $SCENARIOS; do
		# Alternate which system goes first, so that neither always runs on
		# a warmer (or more loaded) machine.
		if ((r % 2)); then
			log "round $r: $s tenure, then etcd"; run_tenure "$s" "$r"; run_etcd "$s" "$r"
		else
			log "round $r: $s etcd, then tenure"; run_etcd "$s" "$r"; run_tenure "$s" "$r"
		fi
	done
done

echo "Machine: $(nproc) cores, $(free -g | awk '/^Mem:/{print $2}') GiB RAM, $(uname -sr); $(go version | awk '{print $3}'); tenure $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'); etcd 3.7.3."
echo "Three voters each on loopback; locks: $CLIENTS clients; kv: $KV_CLIENTS clients; $DURATION per run; $ROUNDS alternating rounds: median (min–max)."
echo
python3 - "$TMP" "$ROUNDS" <<'EOF'
import json, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
def load(sysname, s, r):
    with open(f"{tmp}/{sysname}-{s}.r{r}.json") as f:
        return json.load(f)
rows = [("locks uncontended (cycles/s)", "uncontended", "ops_per_sec"),
        ("locks contended (hand-offs/s)", "contended", "handoffs_per_sec"),
        ("kv put (ops/s)", "put", "ops_per_sec"),
        ("kv get (ops/s)", "get", "ops_per_sec")]
fmt = lambda v: f"{v:,.0f}"
print("| scenario | tenure | etcd | tenure / etcd | tenure p50 / p99 ms | etcd p50 / p99 ms | fairness tenure / etcd |")
print("|---|---|---|---|---|---|---|")
for label, s, key in rows:
    t = [load("tenure", s, r) for r in range(1, rounds + 1)]
    e = [load("etcd", s, r) for r in range(1, rounds + 1)]
    tv, ev = [d[key] for d in t], [d[key] for d in e]
    ratios = [a / b for a, b in zip(tv, ev) if b]
    med = lambda xs: statistics.median(xs)
    def lat(ds):
        return f"{med([d['p50_ms'] for d in ds]):.2f} / {med([d['p99_ms'] for d in ds]):.2f}"
    def fair(ds):
        fs = [d.get("fairness_max_over_min") for d in ds]
        fs = [f for f in fs if f is not None]
        return f"{med(fs):.2f}" if fs else "–"
    fairness = f"{fair(t)} / {fair(e)}" if s == "contended" else ""
    print(f"| {label} | {fmt(med(tv))} ({fmt(min(tv))}–{fmt(max(tv))}) | {fmt(med(ev))} ({fmt(min(ev))}–{fmt(max(ev))}) | "
          f"{med(ratios):.2f}× | {lat(t)} | {lat(e)} | {fairness} |")
EOF

echo
echo "Where a contended hand-off's time goes (Tenure, round 1, from the nodes' metrics):"
echo
python3 - "$TMP" <<'EOF2'
import json, sys
tmp = sys.argv[1]
def read(name):
    m = {}
    for line in open(f"{tmp}/metrics-{name}.txt"):
        node, key, val = line.split()
        m[(node, key)] = float(val)
    return m
b, a = read("before"), read("after")
d = lambda n, k: a.get((n, k), 0) - b.get((n, k), 0)
run = json.load(open(f"{tmp}/tenure-contended.r1.json"))
h = run["handoffs"]
per = 1000 * run["duration_s"] / h
leader = next(n for (n, k), v in a.items() if k == "tenure_raft_is_leader" and v == 1)
print("| figure | value |")
print("|---|---:|")
print(f"| wall time per hand-off | {per:.2f} ms |")
entries = d(leader, "tenure_apply_batch_commands_count")
print(f"| log entries per hand-off (leader) | {entries / h:.2f} |")
for n in sorted({n for n, _ in a}):
    c = d(n, "tenure_log_append_seconds_count")
    if c:
        role = "leader" if n == leader else "follower"
        print(f"| log append + fsync, {role} {n} (mean) | {1000 * d(n, 'tenure_log_append_seconds_sum') / c:.2f} ms |")
EOF2
