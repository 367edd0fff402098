#!/usr/bin/env bash
# Installs the Python clients of etcd's JSON gateway that the etcd
# acceptance suite runs (e2e/etcdcompat/gateway_clients_test.go): Debian's
# python3-etcd3gw and python3-tooz, for /usr/bin/python3. Checks first:
# when both import, it changes nothing. Runs as root or through
# passwordless sudo; retries while another apt-get holds the dpkg lock.
set -euo pipefail

log() { echo ".ci/setup-gw.sh: $*" >&2; }

if /usr/bin/python3 -c 'import etcd3gw, tooz.coordination, tenacity' 2>/dev/null; then
	log "python3-etcd3gw and python3-tooz already installed"
	exit 0
fi

as_root() {
	if [ "$(id -u)" -eq 0 ]; then
		"$@"
	elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
		sudo -n "$@"
	else
		log "need root (or passwordless sudo) to install python3-etcd3gw and python3-tooz"
		exit 1
	fi
}

apt() {
	local i
	for i in 1 2 3; do
		if as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=60 "$@"; then
			return 0
		fi
		log "apt-get $* failed (try $i); the dpkg lock may be held, retrying"
		sleep 10
	done
	return 1
}

log "installing python3-etcd3gw and python3-tooz (apt-get)"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
if ! apt update -qq >"$out" 2>&1 ||
	! apt install -y -qq --no-install-recommends python3-etcd3gw python3-tooz >>"$out" 2>&1; then
	cat "$out" >&2
	log "apt-get install python3-etcd3gw python3-tooz failed"
	exit 1
fi
/usr/bin/python3 -c 'import etcd3gw, tooz.coordination, tenacity' || {
	log "python3-etcd3gw or python3-tooz does not import after installing it"
	exit 1
}
