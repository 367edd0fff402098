#!/usr/bin/env bash
# Simulation for docs/scaling.md: lock names partitioned over several raft
# groups. Each group is an independent single-node `tenure serve` with its
# own data directory (its own log and fsync); the same total number of
# clients is spread evenly over the groups, each client locking and
# unlocking names of its own (uncontended) — or, contended, every group's
# clients share one hot name of that group. Aggregate throughput is the sum
# over the groups, measured in one window.
#
#   bench/groups.sh                          # groups 1 2 4, 64 clients, 8s, 3 rounds
#   GROUPS_LIST="1 2 4 8" ROUNDS=5 bench/groups.sh
#
# Only loopback; only the processes it started are stopped, by PID.
set -euo pipefail

GROUPS_LIST=${GROUPS_LIST:-"1 2 4"}
CLIENTS=${CLIENTS:-64}
DURATION=${DURATION:-8s}
ROUNDS=${ROUNDS:-3}
MODES=${MODES:-"uncontended contended"}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TMP=$(mktemp -d /tmp/tenure-groups.XXXXXX)
PIDS=()
log() { printf '[groups] %s\n' "$*" >&2; }
stop_all() {
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
free_port() {
	local p
	for _ in $(seq 1 200); do
		p=$((20000 + RANDOM % 30000))
		if ! port_in_use "$p"; then echo "$p"; return 0; fi
	done
	return 1
}

log "building tenure and tenure-bench"
(cd "$ROOT" && go build -buildvcs=false -o "$TMP/tenure" ./cmd/tenure && go build -buildvcs=false -o "$TMP/tenure-bench" ./bench/cmd/tenure-bench)
T="$TMP/tenure"

for r in $(seq 1 "$ROUNDS"); do
	for k in $GROUPS_LIST; do
		declare -a EP=()
		for g in $(seq 1 "$k"); do
			EP[$g]=127.0.0.1:$(free_port)
			"$T" serve --http-listen "" --node-id "g$g" --listen "${EP[$g]}" --data-dir "$TMP/r$r-k$k-g$g" \
				>"$TMP/r$r-k$k-g$g.out" 2>"$TMP/r$r-k$k-g$g.err" &
			PIDS+=($!)
		done
		for g in $(seq 1 "$k"); do
			if ! "$T" --endpoint "${EP[$g]}" status --wait 30s >/dev/null; then
				log "group $g of $k did not become ready:"; cat "$TMP/r$r-k$k-g$g.err" >&2; exit 1
			fi
		done
		per=$((CLIENTS / k))
		for mode in $MODES; do
			log "round $r: $k group(s) x $per clients, $mode"
			bench=()
			for g in $(seq 1 "$k"); do
				"$TMP/tenure-bench" --endpoint "${EP[$g]}" --mode "$mode" --clients "$per" --duration "$DURATION" -o json \
					>"$TMP/$mode.k$k.g$g.r$r.json" &
				bench+=($!)
			done
			for pid in "${bench[@]}"; do wait "$pid"; done
		done
		if [[ " $MODES " == *" contended "* ]]; then
			# The control: as many hot names, all in group 1.
			log "round $r: $k hot name(s) in one group x $per clients"
			bench=()
			for g in $(seq 1 "$k"); do
				"$TMP/tenure-bench" --endpoint "${EP[1]}" --mode contended --clients "$per" --duration "$DURATION" -o json \
					>"$TMP/onegroup.k$k.g$g.r$r.json" &
				bench+=($!)
			done
			for pid in "${bench[@]}"; do wait "$pid"; done
		fi
		stop_all
	done
done

echo "Machine: $(nproc) cores, $(free -g | awk '/^Mem:/{print $2}') GiB RAM, $(uname -sr); $(go version | awk '{print $3}'); tenure $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')."
echo "$CLIENTS clients in all, spread over the groups; single-node groups on one disk; $DURATION per run; $ROUNDS rounds: median (min–max) of the sum over groups."
echo
python3 - "$TMP" "$ROUNDS" "$GROUPS_LIST" "$MODES" <<'EOF'
import json, statistics, sys
tmp, rounds, groups, modes = sys.argv[1], int(sys.argv[2]), [int(g) for g in sys.argv[3].split()], sys.argv[4].split()
key = {"uncontended": "ops_per_sec", "contended": "handoffs_per_sec", "onegroup": "handoffs_per_sec"}
label = {"uncontended": "uncontended lock cycles/s", "contended": "contended hand-offs/s (one hot name per group)",
         "onegroup": "control: as many hot names in one group"}
if "contended" in modes:
    modes = modes + ["onegroup"]
print("| groups | " + " | ".join(label[m] for m in modes) + " | " + " | ".join(f"{m} vs 1 group" for m in modes) + " |")
print("|---|" + "---|" * (2 * len(modes)))
base = {}
for k in groups:
    cells, ratios = [], []
    for m in modes:
        sums = []
        for r in range(1, rounds + 1):
            s = 0.0
            for g in range(1, k + 1):
                with open(f"{tmp}/{m}.k{k}.g{g}.r{r}.json") as f:
                    s += json.load(f)[key[m]]
            sums.append(s)
        med = statistics.median(sums)
        base.setdefault(m, med)
        cells.append(f"{med:,.0f} ({min(sums):,.0f}–{max(sums):,.0f})")
        ratios.append(f"{med / base[m]:.2f}×")
    print(f"| {k} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
EOF
