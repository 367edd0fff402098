#!/usr/bin/env bash
# ZooKeeper's clients: Curator's InterProcessMutex against Tenure's
# ZooKeeper front (`tenure serve --zk-listen`) and against ZooKeeper 3.8,
# the same client program against both, in the same run, both with their
# default durability (fsync on: ZooKeeper's forceSync=yes fsyncs its
# transaction log before acknowledging; Tenure fsyncs its raft log).
#
#   bench/zk.sh                              # 16 clients, 5s per run, 3 rounds, one node each
#   NODES=3 bench/zk.sh                      # a ZooKeeper ensemble against a 3-member Tenure cluster
#   CLIENTS=64 DURATION=10s ROUNDS=5 bench/zk.sh
#   KEEP_TMP=1 bench/zk.sh                   # keep logs and raw JSON
#
# Environment:
#   CLIENTS     Curator clients per run, each its own CuratorFramework
#               (connection and session)                       (default 16)
#   DURATION    measurement window per run, in seconds         (default 5)
#   WARMUP      seconds of load before each window, not counted (default 1);
#               before round 1 every mode also runs once against both
#               servers unmeasured (ZooKeeper's JIT warms up)
#   ROUNDS      rounds of both modes against both systems; the order of
#               the systems alternates from round to round      (default 3)
#   MODES       modes to run, in order        (default "uncontended contended")
#   PARENTS     how the lock paths come to exist, each a scenario of its
#               own: "persistent" (created beforehand as persistent znodes)
#               and "containers" (Curator creates them as container znodes
#               when missing)                 (default "persistent containers")
#   NODES       1 (standalone) or 3 (three voters each)         (default 1)
#   MEMBERS     with NODES=3, the members the clients are given: all of
#               them (Curator picks one per client at random), the leader
#               only, or the followers only (found with the `srvr` four-
#               letter word, which both servers answer)     (default all)
#   TENURE_SERVE_FLAGS  extra flags for `tenure serve`
#   TENURE      a tenure binary to run instead of one built from this tree
#               (to compare two builds in runs of their own)
#   KEEP_TMP=1  keep the temp dir (data, logs, raw JSON)
#
# Modes (bench/zk/MutexBench.java):
#   uncontended  every client acquires and releases a lock path of its own
#                in a loop; ops/s are acquire+release cycles per second
#   contended    every client on one lock path, hold time zero; hand-offs/s
#                are grants to another client than the previous holder
# Latencies are the time spent in acquire() (p50/p99 of all clients).
#
# Needs Go, a JDK (java, javac) and Debian's zookeeper and
# libcurator-recipes-java packages (the jars under /usr/share/java). Traffic
# stays on 127.0.0.1; everything lives in one temp dir under /tmp, removed
# on exit; only the processes this script started are stopped, by PID.
set -euo pipefail

CLIENTS=${CLIENTS:-16}
DURATION=${DURATION:-5}
DURATION=${DURATION%s}
WARMUP=${WARMUP:-1}
WARMUP=${WARMUP%s}
ROUNDS=${ROUNDS:-3}
MODES=${MODES:-"uncontended contended"}
PARENTS=${PARENTS:-"persistent containers"}
NODES=${NODES:-1}
MEMBERS=${MEMBERS:-all}
if [[ "$MEMBERS" != all && "$MEMBERS" != leader && "$MEMBERS" != followers ]]; then
	echo "MEMBERS must be all, leader or followers, not '$MEMBERS'" >&2
	exit 2
fi
if ! [[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]]; then
	echo "ROUNDS must be a positive integer, not '$ROUNDS'" >&2
	exit 2
fi
if [[ "$NODES" != 1 && "$NODES" != 3 ]]; then
	echo "NODES must be 1 or 3, not '$NODES'" >&2
	exit 2
fi

JAVA_DIR=/usr/share/java
CP=$JAVA_DIR/curator-recipes.jar:$JAVA_DIR/curator-framework.jar:$JAVA_DIR/curator-client.jar:$JAVA_DIR/zookeeper.jar:$JAVA_DIR/zookeeper-jute.jar:$JAVA_DIR/guava.jar:$JAVA_DIR/slf4j-api.jar:$JAVA_DIR/slf4j-simple.jar
for jar in ${CP//:/ }; do
	if [[ ! -f "$jar" ]]; then
		echo "$jar is missing: install zookeeper and libcurator-recipes-java (.ci/setup-zkc.sh)" >&2
		exit 2
	fi
done
for c in java javac python3; do
	command -v "$c" >/dev/null || { echo "$c is not on PATH" >&2; exit 2; }
done

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TMP=$(mktemp -d /tmp/tenure-zkbench.XXXXXX)
PIDS=()
log() { printf '[zk-bench] %s\n' "$*" >&2; }
cleanup() {
	local rc=$?
	set +e
	for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
	for pid in "${PIDS[@]}"; do
		for _ in $(seq 1 50); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
	done
	if [[ -n "${KEEP_TMP:-}" ]]; then log "kept $TMP"; else rm -rf "$TMP"; fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

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
wait_port() { # port what
	for _ in $(seq 1 600); do
		port_in_use "$1" && return 0
		sleep 0.1
	done
	log "$2 does not listen on 127.0.0.1:$1 within 60s"
	return 1
}

log "building tenure and compiling bench/zk/MutexBench.java"
T="$TMP/tenure"
if [[ -n "${TENURE:-}" ]]; then
	[[ -x "$TENURE" ]] || { echo "TENURE=$TENURE is not an executable" >&2; exit 2; }
	T=$TENURE
else
	(cd "$ROOT" && go build -buildvcs=false -o "$T" ./cmd/tenure)
fi
javac -cp "$CP" -d "$TMP/classes" "$ROOT/bench/zk/MutexBench.java"

# Tenure: NODES members, the ZooKeeper front on each, default tick (2s).
declare -a TZK TADDR TPEER
for i in $(seq 1 "$NODES"); do TZK[$i]=$(free_port); TADDR[$i]=127.0.0.1:$(free_port); TPEER[$i]=127.0.0.1:$(free_port); done
TBOOT=""
for i in $(seq 1 "$NODES"); do TBOOT+="${TBOOT:+,}n$i=${TPEER[$i]}"; done
TEPS="" TCONNECT=""
for i in $(seq 1 "$NODES"); do
	cluster=()
	if ((NODES > 1)); then cluster=(--node-id "n$i" --peer-listen "${TPEER[$i]}" --bootstrap-peers "$TBOOT"); fi
	"$T" serve --http-listen "" --listen "${TADDR[$i]}" --zk-listen "127.0.0.1:${TZK[$i]}" --zk-max-client-cnxns 0 \
		--data-dir "$TMP/tenure-n$i" "${cluster[@]}" ${TENURE_SERVE_FLAGS:-} >"$TMP/tenure-n$i.out" 2>"$TMP/tenure-n$i.err" &
	PIDS+=($!)
	TEPS+="${TEPS:+,}${TADDR[$i]}"
	TCONNECT+="${TCONNECT:+,}127.0.0.1:${TZK[$i]}"
done
"$T" --endpoint "$TEPS" status --wait 30s >/dev/null
for i in $(seq 1 "$NODES"); do wait_port "${TZK[$i]}" "tenure n$i's ZooKeeper front"; done

# ZooKeeper 3.8: standalone, or NODES voters; default tickTime (2000 ms),
# forceSync (fsync on), a configuration and data dir of its own.
declare -a ZCLI ZQ ZE
for i in $(seq 1 "$NODES"); do ZCLI[$i]=$(free_port); ZQ[$i]=$(free_port); ZE[$i]=$(free_port); done
ZCONNECT=""
for i in $(seq 1 "$NODES"); do
	d="$TMP/zookeeper-z$i"
	mkdir -p "$d/data"
	{
		printf 'tickTime=2000\ninitLimit=10\nsyncLimit=5\ndataDir=%s\nclientPort=%s\nclientPortAddress=127.0.0.1\n' "$d/data" "${ZCLI[$i]}"
		printf 'admin.enableServer=false\nmaxClientCnxns=0\n4lw.commands.whitelist=srvr\n'
		if ((NODES > 1)); then
			for j in $(seq 1 "$NODES"); do printf 'server.%d=127.0.0.1:%s:%s\n' "$j" "${ZQ[$j]}" "${ZE[$j]}"; done
		fi
	} >"$d/zoo.cfg"
	main=org.apache.zookeeper.server.ZooKeeperServerMain
	if ((NODES > 1)); then
		echo "$i" >"$d/data/myid"
		main=org.apache.zookeeper.server.quorum.QuorumPeerMain
	fi
	java -Xmx512m -Dorg.slf4j.simpleLogger.defaultLogLevel=warn -Dzookeeper.jmx.log4j.disable=true \
		-cp "$CP" "$main" "$d/zoo.cfg" >"$d/out.log" 2>&1 &
	PIDS+=($!)
	ZCONNECT+="${ZCONNECT:+,}127.0.0.1:${ZCLI[$i]}"
done
for i in $(seq 1 "$NODES"); do wait_port "${ZCLI[$i]}" "zookeeper z$i"; done

# mode PORT: the Mode line of a server's `srvr` answer (leader, follower,
# standalone).
mode() {
	local m
	m=$( (exec 3<>"/dev/tcp/127.0.0.1/$1" && printf srvr >&3 && timeout 5 cat <&3) 2>/dev/null | awk -F': ' '/^Mode/{print $2}' | tr -d '\r')
	echo "${m:-unknown}"
}
# members PORT...: the connect string of the ports MEMBERS selects.
members() {
	local out="" p m
	for p in "$@"; do
		m=all
		[[ $MEMBERS != all ]] && m=$(mode "$p")
		if [[ $MEMBERS == all || ($MEMBERS == leader && $m == leader) || ($MEMBERS == followers && $m == follower) ]]; then
			out+="${out:+,}127.0.0.1:$p"
		fi
	done
	if [[ -z $out ]]; then
		log "no member is $MEMBERS among ports $*"
		return 1
	fi
	echo "$out"
}
if [[ $MEMBERS != all ]]; then
	# An ensemble elects its leader once a quorum is up.
	for _ in $(seq 1 300); do
		if members "${ZCLI[@]}" >/dev/null 2>&1 && members "${TZK[@]}" >/dev/null 2>&1; then break; fi
		sleep 0.1
	done
	ZCONNECT=$(members "${ZCLI[@]}")
	TCONNECT=$(members "${TZK[@]}")
	log "$MEMBERS: tenure $TCONNECT, zookeeper $ZCONNECT"
fi

bench() { # system mode parents round
	local connect=$TCONNECT
	[[ $1 == zookeeper ]] && connect=$ZCONNECT
	# MutexBench waits for its sessions (a new ensemble elects first).
	local out="$TMP/$1-$2-$3.r$4"
	if ! java -Xmx512m -Dorg.slf4j.simpleLogger.defaultLogLevel=warn -cp "$TMP/classes:$CP" MutexBench \
		"$connect" "$2" "$CLIENTS" "$DURATION" "$WARMUP" "/bench-$2-$3-r$4" "$3" >"$out.json" 2>"$out.err"; then
		log "$1 $2 $3 round $4 failed:"
		tail -n 20 "$out.err" >&2
		cat "$out.json" >&2
		return 1
	fi
}

# An unmeasured pass of every mode against both servers first: ZooKeeper's
# JVM compiles its hot paths in its first seconds under load, and a round
# 1 against a cold server would measure its interpreter.
for m in $MODES; do
	log "warm-up: $m, tenure and zookeeper"
	bench tenure "$m" persistent 0
	bench zookeeper "$m" persistent 0
done

for r in $(seq 1 "$ROUNDS"); do
	for p in $PARENTS; do
		for m in $MODES; do
			if ((r % 2)); then
				log "round $r: $m, $p lock paths: tenure, then zookeeper"; bench tenure "$m" "$p" "$r"; bench zookeeper "$m" "$p" "$r"
			else
				log "round $r: $m, $p lock paths: zookeeper, then tenure"; bench zookeeper "$m" "$p" "$r"; bench tenure "$m" "$p" "$r"
			fi
		done
	done
done

ZKVER=$(dpkg-query -W -f '${Version}' zookeeper 2>/dev/null || true)
CURVER=$(dpkg-query -W -f '${Version}' libcurator-recipes-java 2>/dev/null || true)
echo "Machine: $(nproc) cores, $(free -g | awk '/^Mem:/{print $2}') GiB RAM, $(uname -sr); load average $(cut -d' ' -f1-3 /proc/loadavg); $(go version | awk '{print $3}'); $(java -version 2>&1 | head -1); tenure ${TENURE:-$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')}; ZooKeeper ${ZKVER:-?} and Curator ${CURVER:-?} (Debian packages)."
echo "$NODES node(s) each on loopback, clients given $MEMBERS of them, fsync on; $CLIENTS Curator clients; ${DURATION}s per run after ${WARMUP}s of warm-up; $ROUNDS alternating rounds: median (min–max)."
echo
python3 - "$TMP" "$ROUNDS" "$MODES" "$PARENTS" <<'PY'
import json, statistics, sys
tmp, rounds, modes, parents = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
scen = [(m, p) for p in parents for m in modes]
def load(s, mp, r):
    m, p = mp
    with open(f"{tmp}/{s}-{m}-{p}.r{r}.json") as f:
        return json.load(f)
med = statistics.median
fmt = lambda v: f"{v:,.0f}"
print("| mode, lock paths | Tenure | ZooKeeper | Tenure / ZooKeeper | acquire p50 / p99 ms, Tenure | acquire p50 / p99 ms, ZooKeeper | errors T / Z |")
print("|---|---|---|---|---|---|---|")
for m in scen:
    key, label = ("handoffs_per_sec", "contended (hand-offs/s)") if m[0] == "contended" else ("ops_per_sec", "uncontended (cycles/s)")
    label += ", " + m[1]
    t = [load("tenure", m, r) for r in range(1, rounds + 1)]
    z = [load("zookeeper", m, r) for r in range(1, rounds + 1)]
    tv, zv = [d[key] for d in t], [d[key] for d in z]
    ratios = [a / b for a, b in zip(tv, zv) if b]
    lat = lambda ds: f"{med([d['p50_ms'] for d in ds]):.2f} / {med([d['p99_ms'] for d in ds]):.2f}"
    errs = lambda ds: sum(d["errors"] for d in ds)
    print(f"| {label} | {fmt(med(tv))} ({fmt(min(tv))}–{fmt(max(tv))}) | {fmt(med(zv))} ({fmt(min(zv))}–{fmt(max(zv))}) | "
          f"**{med(ratios):.2f}×** ({min(ratios):.2f}–{max(ratios):.2f}) | {lat(t)} | {lat(z)} | {errs(t)} / {errs(z)} |")
print()
print("Every run (rate, acquire p50 ms, errors):")
print()
for m in scen:
    key = "handoffs_per_sec" if m[0] == "contended" else "ops_per_sec"
    for s in ("tenure", "zookeeper"):
        row = [load(s, m, r) for r in range(1, rounds + 1)]
        print(f"    {m[0]:12s} {m[1]:11s} {s:9s} " + "  ".join(f"r{i+1} {fmt(d[key])} ({d['p50_ms']:.2f}, {d['errors']})" for i, d in enumerate(row)))
PY
