#!/usr/bin/env bash
# Lock benchmark: Tenure against etcd's concurrency.Mutex, both single-node on
# loopback, both with their default durability (fsync on).
#
#   bench/run.sh                      # 64 clients, 10s per run, both modes
#   ROUNDS=5 DURATION=8s bench/run.sh # five alternating rounds, median ratios
#   CLIENTS=16 DURATION=5s bench/run.sh
#   SKIP_TENURE=1 bench/run.sh        # etcd half only
#   ETCD_API=1 ROUNDS=5 bench/run.sh  # Tenure through its etcd API, measured
#                                     # with the same etcd-bench as etcd
#
# Environment:
#   CLIENTS        concurrent lock clients per run            (default 64)
#   DURATION       measurement window per run                 (default 10s)
#   MODES          modes to run, in order                     (default "uncontended contended")
#   ROUNDS         rounds of every mode against both systems  (default 1); with
#                  more than one, the order of the two systems alternates
#                  from round to round, the detailed table is round 1's,
#                  and a table of every round's rates with the median
#                  ratio per mode follows
#   TENURE_LISTEN  address for `tenure serve`                 (default 127.0.0.1:17070)
#   TENURE_SERVE_FLAGS extra flags for `tenure serve` (e.g. "--log-store bolt")
#   SKIP_TENURE=1  do not build, start or bench tenure
#   ETCD_API=1     serve Tenure's etcd API too (--etcd-listen) and measure
#                  Tenure through it with etcd-bench (etcd's own
#                  concurrency.Mutex), instead of with tenure-bench: the
#                  same client program against both servers
#   KEEP_TMP=1     keep the temp dir (binaries, data, logs, raw JSON)
#
# Everything it builds, every data dir and every log lives in one temp dir
# under /tmp, removed on exit. Only the processes this script started are
# stopped, by PID.
set -euo pipefail

CLIENTS=${CLIENTS:-64}
DURATION=${DURATION:-10s}
MODES=${MODES:-"uncontended contended"}
ROUNDS=${ROUNDS:-1}
if ! [[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]]; then
	echo "ROUNDS must be a positive integer, not '$ROUNDS'" >&2
	exit 1
fi
TENURE_LISTEN=${TENURE_LISTEN:-127.0.0.1:17070}
SKIP_TENURE=${SKIP_TENURE:-0}
ETCD_API=${ETCD_API:-0}
KEEP_TMP=${KEEP_TMP:-0}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TMP=$(mktemp -d /tmp/tenure-bench.XXXXXX)
PIDS=()

log() { printf '[bench] %s\n' "$*" >&2; }

cleanup() {
	local rc=$?
	set +e
	for pid in "${PIDS[@]}"; do
		kill "$pid" 2>/dev/null
	done
	for pid in "${PIDS[@]}"; do
		for _ in $(seq 1 50); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "$pid" 2>/dev/null; then
			kill -9 "$pid" 2>/dev/null
		fi
		wait "$pid" 2>/dev/null
	done
	if [[ "$KEEP_TMP" == 1 ]]; then
		log "kept $TMP"
	else
		rm -rf "$TMP"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# port_in_use PORT: true when something accepts connections on 127.0.0.1:PORT.
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# free_port: a loopback TCP port nobody is listening on.
free_port() {
	local p
	for _ in $(seq 1 200); do
		p=$((20000 + RANDOM % 30000))
		if ! port_in_use "$p"; then
			echo "$p"
			return 0
		fi
	done
	echo "no free port found" >&2
	return 1
}

# json_field FILE KEY: value of a top-level scalar field of the JSON object in
# FILE (compact or indented), or empty when absent.
json_field() {
	tr -d '\n\r\t ' <"$1" |
		grep -o -E "\"$2\":(\"[^\"]*\"|[-+0-9.eE]+|null|true|false)" |
		head -n 1 | sed -E "s/^\"$2\"://" | tr -d '"' || true
}

# Keep only the JSON object from a command's stdout (drops any stray lines).
extract_json() {
	tr -d '\r' <"$1" | awk '
		!f && /^[[:space:]]*\{.*\}[[:space:]]*$/ { print; exit }
		!f && /^[[:space:]]*\{[[:space:]]*$/     { f = 1 }
		f                                         { print }
		f && /^\}[[:space:]]*$/                   { exit }
	' >"$2"
}

# ---------------------------------------------------------------- build
log "temp dir $TMP"
log "building etcd server and etcd-bench (bench/etcd module)"
(cd "$ROOT/bench/etcd" && GOWORK=off go build -buildvcs=false -o "$TMP/etcd-server" ./cmd/etcd-server)
(cd "$ROOT/bench/etcd" && GOWORK=off go build -buildvcs=false -o "$TMP/etcd-bench" ./cmd/etcd-bench)

if [[ "$SKIP_TENURE" != 1 ]]; then
	log "building tenure and tenure-bench"
	(cd "$ROOT" && go build -buildvcs=false -o "$TMP/tenure" ./cmd/tenure && go build -buildvcs=false -o "$TMP/tenure-bench" ./bench/cmd/tenure-bench)
fi

# ---------------------------------------------------------------- start servers
if [[ "$SKIP_TENURE" != 1 ]]; then
	tport=${TENURE_LISTEN##*:}
	if port_in_use "$tport"; then
		log "error: $TENURE_LISTEN is already in use"
		exit 1
	fi
	etcd_api_flags=()
	if [[ "$ETCD_API" == 1 ]]; then
		TENURE_ETCD="127.0.0.1:$(free_port)"
		etcd_api_flags=(--etcd-listen "$TENURE_ETCD")
	fi
	log "starting tenure serve on $TENURE_LISTEN ${etcd_api_flags[*]}"
	"$TMP/tenure" serve --http-listen 127.0.0.1:0 --data-dir "$TMP/tenure-data" --listen "$TENURE_LISTEN" "${etcd_api_flags[@]}" ${TENURE_SERVE_FLAGS:-} >"$TMP/tenure.log" 2>&1 &
	PIDS+=($!)
	tpid=$!
	ready=0
	for _ in $(seq 1 300); do
		if ! kill -0 "$tpid" 2>/dev/null; then
			log "tenure serve exited early; log:"
			cat "$TMP/tenure.log" >&2
			exit 1
		fi
		# `serve` prints its ready line once it leads and serves (status
		# would answer earlier, before there is a leader).
		if grep -q "serving on" "$TMP/tenure.log" 2>/dev/null; then
			ready=1
			break
		fi
		sleep 0.1
	done
	if [[ $ready != 1 ]]; then
		log "tenure did not print its ready line within 30s; log:"
		tail -n 50 "$TMP/tenure.log" >&2
		exit 1
	fi
fi

ETCD_CLIENT_PORT=$(free_port)
ETCD_PEER_PORT=$(free_port)
while [[ "$ETCD_PEER_PORT" == "$ETCD_CLIENT_PORT" ]]; do ETCD_PEER_PORT=$(free_port); done
ETCD_EP="127.0.0.1:$ETCD_CLIENT_PORT"
log "starting etcd on $ETCD_EP (peer port $ETCD_PEER_PORT, data $TMP/etcd-data)"
# Default settings: fsync on, default snapshot and heartbeat settings.
"$TMP/etcd-server" \
	--name bench \
	--data-dir "$TMP/etcd-data" \
	--listen-client-urls "http://$ETCD_EP" \
	--advertise-client-urls "http://$ETCD_EP" \
	--listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
	--initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
	--initial-cluster "bench=http://127.0.0.1:$ETCD_PEER_PORT" \
	--initial-cluster-state new \
	--log-level warn >"$TMP/etcd.log" 2>&1 &
PIDS+=($!)
epid=$!
ready=0
for _ in $(seq 1 300); do
	if ! kill -0 "$epid" 2>/dev/null; then
		log "etcd exited early; log:"
		cat "$TMP/etcd.log" >&2
		exit 1
	fi
	if command -v curl >/dev/null 2>&1; then
		if curl -fsS --max-time 1 "http://$ETCD_EP/health" 2>/dev/null | grep -q '"health":"true"'; then
			ready=1
			break
		fi
	elif port_in_use "$ETCD_CLIENT_PORT"; then
		ready=1
		break
	fi
	sleep 0.1
done
if [[ $ready != 1 ]]; then
	log "etcd did not become healthy within 30s; log:"
	tail -n 50 "$TMP/etcd.log" >&2
	exit 1
fi

# ---------------------------------------------------------------- run
# run_tenure MODE ROUND / run_etcd MODE ROUND: one measurement, its JSON in
# $TMP/<system>-<mode>.r<round>.json.
run_tenure() {
	log "round $2 tenure: mode=$1 clients=$CLIENTS duration=$DURATION"
	local bench=("$TMP/tenure-bench" --endpoint "$TENURE_LISTEN")
	if [[ "$ETCD_API" == 1 ]]; then
		bench=("$TMP/etcd-bench" --endpoints "$TENURE_ETCD")
	fi
	"${bench[@]}" --mode "$1" --clients "$CLIENTS" \
		--duration "$DURATION" -o json >"$TMP/tenure-$1.out" 2>"$TMP/tenure-$1.err" || {
		log "tenure-bench failed:"
		cat "$TMP/tenure-$1.err" >&2
		exit 1
	}
	extract_json "$TMP/tenure-$1.out" "$TMP/tenure-$1.r$2.json"
	sleep 1
}
run_etcd() {
	log "round $2 etcd:   mode=$1 clients=$CLIENTS duration=$DURATION"
	"$TMP/etcd-bench" --endpoints "$ETCD_EP" --mode "$1" --clients "$CLIENTS" \
		--duration "$DURATION" -o json >"$TMP/etcd-$1.out" 2>"$TMP/etcd-$1.err" || {
		log "etcd-bench failed:"
		cat "$TMP/etcd-$1.err" >&2
		exit 1
	}
	extract_json "$TMP/etcd-$1.out" "$TMP/etcd-$1.r$2.json"
	sleep 1
}
for round in $(seq 1 "$ROUNDS"); do
	for mode in $MODES; do
		if [[ "$SKIP_TENURE" == 1 ]]; then
			run_etcd "$mode" "$round"
		elif ((round % 2 == 1)); then
			run_tenure "$mode" "$round"
			run_etcd "$mode" "$round"
		else
			run_etcd "$mode" "$round"
			run_tenure "$mode" "$round"
		fi
	done
done
for mode in $MODES; do
	for sys in tenure etcd; do
		[[ -s "$TMP/$sys-$mode.r1.json" ]] && cp "$TMP/$sys-$mode.r1.json" "$TMP/$sys-$mode.json"
	done
done

# ---------------------------------------------------------------- report
val() { # val SYSTEM MODE KEY
	local f="$TMP/$1-$2.json"
	[[ -s "$f" ]] || { echo ""; return; }
	json_field "$f" "$3" || true
}
fmt() { # fmt VALUE
	if [[ -z "$1" || "$1" == null ]]; then echo "-"; else awk -v v="$1" 'BEGIN{ a = (v < 0 ? -v : v); if (v == int(v)) printf "%d", v; else if (a >= 100) printf "%.0f", v; else if (a >= 1) printf "%.2f", v; else printf "%.3f", v }'; fi
}
ratio() { # ratio A B  -> A/B
	if [[ -z "$1" || -z "$2" || "$1" == null || "$2" == null ]]; then echo "-"; return; fi
	awk -v a="$1" -v b="$2" 'BEGIN{ if (b == 0) { print "-"; exit } r = a / b; if (r < 0.1) printf "%.3fx", r; else printf "%.2fx", r }'
}

echo
echo "## Lock benchmark: Tenure vs etcd ($CLIENTS clients, $DURATION per run, single node, loopback, fsync on)"
echo
if [[ "$ETCD_API" == 1 ]]; then
	echo "Machine: $(nproc 2>/dev/null || echo '?') cores, $(uname -sr). etcd $("$TMP/etcd-server" --version 2>/dev/null | sed -n 's/^etcd Version: //p'). Client of both: etcd-bench (concurrency.Mutex); Tenure through its etcd API."
else
	echo "Machine: $(nproc 2>/dev/null || echo '?') cores, $(uname -sr). etcd $("$TMP/etcd-server" --version 2>/dev/null | sed -n 's/^etcd Version: //p'), client: concurrency.Mutex."
fi
echo
echo "| mode | metric | tenure | etcd | tenure/etcd |"
echo "| --- | --- | ---: | ---: | ---: |"
for mode in $MODES; do
	for pair in "ops_per_sec:lock+unlock cycles/s" "handoffs_per_sec:hand-offs/s" "p50_ms:acquire wait p50 (ms)" \
		"p99_ms:acquire wait p99 (ms)" "errors:errors" "fairness_max_over_min:fairness (max/min grants)"; do
		key=${pair%%:*}
		label=${pair#*:}
		# one client per lock: there is no hand-off to count
		[[ "$mode" == uncontended && "$key" == handoffs_per_sec ]] && continue
		t=$(val tenure "$mode" "$key")
		e=$(val etcd "$mode" "$key")
		r=$(ratio "$t" "$e")
		[[ "$key" == errors ]] && r="-"
		echo "| $mode | $label | $(fmt "$t") | $(fmt "$e") | $r |"
	done
done
echo
echo "Higher is better for cycles/s and hand-offs/s; lower is better for wait times and fairness (1.00 = perfectly even)."
echo
echo "Raw results:"
echo
echo '```'
for round in $(seq 1 "$ROUNDS"); do
	for mode in $MODES; do
		for sys in tenure etcd; do
			f="$TMP/$sys-$mode.r$round.json"
			[[ -s "$f" ]] && tr -d '\n' <"$f" | tr -s ' ' && echo
		done
	done
done
echo '```'

# ---------------------------------------------------------------- rounds
if ((ROUNDS > 1)) && [[ "$SKIP_TENURE" != 1 ]]; then
	rate_key() { if [[ "$1" == contended ]]; then echo handoffs_per_sec; else echo ops_per_sec; fi; }
	rate_label() { if [[ "$1" == contended ]]; then echo hand-offs/s; else echo lock+unlock cycles/s; fi; }
	echo
	echo "### Every round ($ROUNDS; odd rounds ran Tenure first, even rounds etcd first)"
	echo
	echo "| round | mode | rate | tenure | etcd | tenure/etcd |"
	echo "| ---: | --- | --- | ---: | ---: | ---: |"
	for mode in $MODES; do
		key=$(rate_key "$mode")
		: >"$TMP/ratios-$mode"
		for round in $(seq 1 "$ROUNDS"); do
			t=$(json_field "$TMP/tenure-$mode.r$round.json" "$key")
			e=$(json_field "$TMP/etcd-$mode.r$round.json" "$key")
			echo "| $round | $mode | $(rate_label "$mode") | $(fmt "$t") | $(fmt "$e") | $(ratio "$t" "$e") |"
			awk -v a="$t" -v b="$e" 'BEGIN{ if (b > 0) printf "%.4f\n", a / b }' >>"$TMP/ratios-$mode"
		done
	done
	echo
	for mode in $MODES; do
		sort -n "$TMP/ratios-$mode" | awk -v m="$mode" '
			{ r[NR] = $1 }
			END {
				if (NR == 0) exit
				med = (NR % 2) ? r[(NR + 1) / 2] : (r[NR / 2] + r[NR / 2 + 1]) / 2
				printf "%s: median ratio %.2fx (min %.2fx, max %.2fx) over %d rounds\n", m, med, r[1], r[NR], NR
			}'
	done
fi
