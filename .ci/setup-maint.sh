# Sourced by .ci/run. setup_python_etcd3 installs Debian's python3-etcd3
# unless the system python3 imports it: e2e/etcdcompat's
# TestPythonEtcd3NestedTxn runs it against Tenure's etcd API.
setup_python_etcd3() {
	if /usr/bin/python3 -c 'import etcd3' >/dev/null 2>&1; then
		log "python3-etcd3 already installed"
		return
	fi
	log "installing python3-etcd3 (apt-get)"
	local out
	out=$(mktemp)
	if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 update -qq >"$out" 2>&1 ||
		! as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends python3-etcd3 >>"$out" 2>&1; then
		cat "$out" >&2
		rm -f "$out"
		die "apt-get install python3-etcd3 failed"
	fi
	rm -f "$out"
	/usr/bin/python3 -c 'import etcd3' || die "python3-etcd3 does not import after installing it"
}

setup_python_etcd3
