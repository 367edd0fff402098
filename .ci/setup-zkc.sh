#!/usr/bin/env bash
# Installs what the ZooKeeper acceptance suite (e2e/zkcompat) runs: Kazoo
# (python3-kazoo), ZooKeeper 3.8 (zookeeper: the reference server and
# zkCli.sh), Curator's recipes (libcurator-recipes-java), Netty
# (libnetty-java, which zookeeper pulls in: ZooKeeper's TLS, both sides)
# and a JDK (default-jdk-headless: the suite compiles its Curator
# programs). Each
# package is checked first: with all of them installed this changes
# nothing. Needs root or passwordless sudo only to install.
set -euo pipefail

log() { echo "setup-zkc: $*" >&2; }

as_root() {
	if [ "$(id -u)" -eq 0 ]; then
		"$@"
	elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
		sudo -n "$@"
	else
		log "need root (or passwordless sudo) to install: $*"
		exit 1
	fi
}

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

# apt_get retries while another apt-get or dpkg holds the lock.
apt_get() {
	local i out
	out=$(mktemp)
	for i in $(seq 1 30); do
		if as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=60 "$@" >"$out" 2>&1; then
			rm -f "$out"
			return 0
		fi
		if ! grep -qiE 'lock|dpkg was interrupted' "$out"; then
			break
		fi
		log "apt-get is busy (dpkg lock); retrying"
		sleep 5
	done
	cat "$out" >&2
	rm -f "$out"
	log "apt-get $* failed"
	exit 1
}

missing=()
for p in python3-kazoo zookeeper libcurator-recipes-java libnetty-java default-jdk-headless; do
	installed "$p" || missing+=("$p")
done
if [ "${#missing[@]}" -eq 0 ]; then
	log "python3-kazoo, zookeeper, libcurator-recipes-java, libnetty-java and default-jdk-headless already installed"
	exit 0
fi
log "installing ${missing[*]} (apt-get)"
apt_get update -qq
apt_get install -y -qq --no-install-recommends "${missing[@]}"
