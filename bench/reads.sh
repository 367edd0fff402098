#!/usr/bin/env bash
# Linearizable reads through the etcd API: etcd's own clients against
# Tenure's etcd API, built twice (BASE, a git revision, and the working
# tree), and against etcd 3.7.3, all three started side by side and
# measured in the same run, single node and three voters, default
# durability (fsync on every node), loopback.
#
#   mutex contended     CLIENTS clients of etcd's concurrency.Mutex
#                       (client/v3/concurrency, via etcd-bench) on one
#                       name: each hand-off is a txn and two
#                       linearizable gets, and a watch
#   mutex uncontended   CLIENTS clients, each on its own name
#   kv get              KV_CLIENTS clients of clientv3 Get
#                       (linearizable), each on its own key
#   kv get under puts   the same gets while KV_CLIENTS other clients
#                       put: the gets' rate is reported
#
# Every client is given every endpoint of the system it measures. Runs
# rotate which system goes first from round to round; the tables give
# each figure's median and range over the rounds.
#
#   BASE=main bench/reads.sh
#   BASE=main ROUNDS=5 DURATION=8s TOPOLOGIES=three bench/reads.sh
#
# Environment:
#   BASE        git revision to compare the working tree against (default main)
#   ROUNDS      rounds (default 3)
#   DURATION    measurement window per run (default 5s)
#   CLIENTS     Mutex clients (default 64)
#   KV_CLIENTS  kv clients (default 16)
#   TOPOLOGIES  "single three" (default), or either
#   SCENARIOS   "contended uncontended get getput" (default), or a subset
#   KEEP_TMP=1  keep the temp dir (logs, raw JSON)
#
# Everything it builds and every data dir lives in one temp dir under /tmp;
# only the processes this script started are stopped, by PID.
set -euo pipefail

BASE=${BASE:-main}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-5s}
CLIENTS=${CLIENTS:-64}
KV_CLIENTS=${KV_CLIENTS:-16}
TOPOLOGIES=${TOPOLOGIES:-"single three"}
SCENARIOS=${SCENARIOS:-"contended uncontended get getput"}
if ! [[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]]; then
	echo "ROUNDS must be a positive integer, not '$ROUNDS'" >&2
	exit 2
fi

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TMP=$(mktemp -d /tmp/tenure-reads.XXXXXX)
PIDS=()
log() { printf '[reads] %s\n' "$*" >&2; }
# stop_all: stop every process started so far, by PID.
stop_all() {
	local pid
	for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
	for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
	PIDS=()
}
cleanup() {
	local rc=$?
	set +e
	stop_all
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

log "building the working tree, $BASE, etcd-server, etcd-bench and etcd-kv-bench"
(cd "$ROOT" && go build -buildvcs=false -o "$TMP/tree" ./cmd/tenure)
mkdir "$TMP/base-src"
(cd "$ROOT" && git archive "$BASE") | tar -x -C "$TMP/base-src"
(cd "$TMP/base-src" && go build -buildvcs=false -o "$TMP/base" ./cmd/tenure)
for c in etcd-server etcd-bench etcd-kv-bench; do
	(cd "$ROOT/bench/etcd" && GOWORK=off go build -buildvcs=false -o "$TMP/$c" "./cmd/$c")
done
BASE_REV=$(git -C "$ROOT" rev-parse --short "$BASE")
TREE_REV=$(git -C "$ROOT" rev-parse --short HEAD)
if [[ -n "$(git -C "$ROOT" status --porcelain -- cmd internal go.mod go.sum)" ]]; then TREE_REV="$TREE_REV+changes"; fi

# wait_etcd_api EPS: until a put through the etcd API at EPS succeeds.
wait_etcd_api() {
	for _ in $(seq 1 300); do
		if "$TMP/etcd-kv-bench" --endpoints "$1" --op put --clients 1 --duration 100ms >/dev/null 2>&1; then return 0; fi
		sleep 0.1
	done
	log "the etcd API at $1 did not answer a put within 30s"
	return 1
}

# start_tenure BUILD N: N voters of BUILD (base or tree) with the etcd API;
# sets EPS_<BUILD> to their etcd endpoints.
start_tenure() {
	local b=$1 n=$2 i boot="" eps="" dir="$TMP/$1-$2"
	declare -a addr peer etcd http
	for i in $(seq 1 "$n"); do
		addr[i]=127.0.0.1:$(free_port); peer[i]=127.0.0.1:$(free_port)
		etcd[i]=127.0.0.1:$(free_port); http[i]=127.0.0.1:$(free_port)
		boot="$boot${boot:+,}n$i=${peer[i]}"; eps="$eps${eps:+,}${etcd[i]}"
	done
	for i in $(seq 1 "$n"); do
		local cluster=()
		((n > 1)) && cluster=(--node-id "n$i" --peer-listen "${peer[i]}" --bootstrap-peers "$boot")
		"$TMP/$b" serve --http-listen "${http[i]}" --listen "${addr[i]}" --etcd-listen "${etcd[i]}" \
			--data-dir "$dir/n$i" "${cluster[@]}" >"$dir-n$i.out" 2>"$dir-n$i.err" &
		PIDS+=($!)
	done
	wait_etcd_api "$eps"
	printf -v "EPS_$b" '%s' "$eps"
}

# start_etcd N: N etcd members; sets EPS_etcd.
start_etcd() {
	local n=$1 i cluster="" eps=""
	declare -a cli peer
	for i in $(seq 1 "$n"); do
		cli[i]=127.0.0.1:$(free_port); peer[i]=127.0.0.1:$(free_port)
		cluster="$cluster${cluster:+,}e$i=http://${peer[i]}"; eps="$eps${eps:+,}${cli[i]}"
	done
	for i in $(seq 1 "$n"); do
		"$TMP/etcd-server" --name "e$i" --data-dir "$TMP/etcd-$n/e$i" \
			--listen-client-urls "http://${cli[i]}" --advertise-client-urls "http://${cli[i]}" \
			--listen-peer-urls "http://${peer[i]}" --initial-advertise-peer-urls "http://${peer[i]}" \
			--initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token "reads-$n" \
			--log-level warn >"$TMP/etcd-$n-e$i.log" 2>&1 &
		PIDS+=($!)
	done
	wait_etcd_api "$eps"
	EPS_etcd=$eps
}

# measure SYSTEM SCENARIO OUT: one run against SYSTEM's endpoints.
measure() {
	local eps_var="EPS_$1"
	local eps=${!eps_var}
	case $2 in
	contended | uncontended)
		"$TMP/etcd-bench" --endpoints "$eps" --mode "$2" --clients "$CLIENTS" --duration "$DURATION" -o json >"$3" ;;
	get)
		"$TMP/etcd-kv-bench" --endpoints "$eps" --op get --clients "$KV_CLIENTS" --duration "$DURATION" >"$3" ;;
	getput)
		"$TMP/etcd-kv-bench" --endpoints "$eps" --op put --clients "$KV_CLIENTS" --duration "$DURATION" >"$3.put" &
		local put=$!
		"$TMP/etcd-kv-bench" --endpoints "$eps" --op get --clients "$KV_CLIENTS" --duration "$DURATION" >"$3"
		wait "$put" ;;
	esac
}

SYSTEMS=(base tree etcd)
: >"$TMP/results.tsv"
for topo in $TOPOLOGIES; do
	case $topo in single) n=1 ;; three) n=3 ;; *) log "unknown topology $topo"; exit 2 ;; esac
	log "$topo: starting $BASE ($BASE_REV), the working tree ($TREE_REV) and etcd, $n voter(s) each"
	start_tenure base "$n"
	start_tenure tree "$n"
	start_etcd "$n"
	for r in $(seq 1 "$ROUNDS"); do
		for s in $SCENARIOS; do
			# Rotate which system goes first, so that none always runs on
			# a warmer (or less loaded) machine.
			order=()
			for k in 0 1 2; do order+=("${SYSTEMS[$(((r - 1 + k) % 3))]}"); done
			log "$topo round $r: $s (${order[*]})"
			for sys in "${order[@]}"; do
				out="$TMP/$topo-$s-$sys.r$r.json"
				measure "$sys" "$s" "$out"
				printf '%s\t%s\t%s\t%s\t%s\n' "$topo" "$s" "$sys" "$r" "$out" >>"$TMP/results.tsv"
			done
		done
	done
	stop_all
done

echo "Machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at the end, $(uname -sr); $(go version | awk '{print $3}'); base $BASE ($BASE_REV), tree $TREE_REV; etcd 3.7.3."
echo "Clients: etcd's clientv3 (etcd-bench: concurrency.Mutex, $CLIENTS clients; etcd-kv-bench: $KV_CLIENTS clients), every endpoint given; $DURATION per run; $ROUNDS rounds, the order rotating: median (min–max)."
echo
python3 - "$TMP/results.tsv" <<'EOF'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    topo, s, sysname, r, path = line.rstrip("\n").split("\t")
    with open(path) as f:
        d = json.load(f)
    if s == "getput":
        with open(path + ".put") as f:
            d["put_ops_per_sec"] = json.load(f)["ops_per_sec"]
    rows.setdefault((topo, s), {}).setdefault(sysname, []).append(d)
labels = {"contended": ("Mutex contended", "hand-offs/s", "handoffs_per_sec"),
          "uncontended": ("Mutex uncontended", "lock+unlock/s", "ops_per_sec"),
          "get": ("kv get", "gets/s", "ops_per_sec"),
          "getput": ("kv get under puts", "gets/s", "ops_per_sec")}
fmt = lambda v: f"{v:,.0f}"
def cell(ds, key):
    vs = [d[key] for d in ds]
    return f"{fmt(statistics.median(vs))} ({fmt(min(vs))}–{fmt(max(vs))})", statistics.median(vs)
print("| voters | scenario | rate | base | tree | etcd | tree / base | tree / etcd | p50 ms base / tree / etcd |")
print("|---|---|---|---|---|---|---|---|---|")
for (topo, s), by in rows.items():
    label, unit, key = labels[s]
    cells, med = {}, {}
    for sysname in ("base", "tree", "etcd"):
        cells[sysname], med[sysname] = cell(by[sysname], key)
    p50 = " / ".join(f"{statistics.median([d['p50_ms'] for d in by[x]]):.2f}" for x in ("base", "tree", "etcd"))
    ratio = lambda a, b: f"{med[a] / med[b]:.2f}×" if med[b] else "–"
    voters = "1" if topo == "single" else "3"
    print(f"| {voters} | {label} | {unit} | {cells['base']} | {cells['tree']} | {cells['etcd']} | {ratio('tree', 'base')} | {ratio('tree', 'etcd')} | {p50} |")
errs = [(k, x, sum(d.get("errors", 0) for d in ds)) for k, by in rows.items() for x, ds in by.items()]
errs = [e for e in errs if e[2]]
if errs:
    print()
    print("Errors: " + ", ".join(f"{t} {s} {x}: {n}" for (t, s), x, n in errs))
puts = [(k, x, statistics.median([d["put_ops_per_sec"] for d in ds])) for k, by in rows.items() if k[1] == "getput" for x, ds in by.items()]
if puts:
    print()
    print("Puts beside the gets (median ops/s): " + "; ".join(f"{'1' if t == 'single' else '3'} voter(s) {x} {fmt(v)}" for (t, _), x, v in puts))
EOF
