# Sourced by .ci/run (it uses its log, die, as_root and install_postgres):
# installs what e2e/etcdcompat's TestPatroni runs, from Debian's packages:
# patroni, python3-etcd (Patroni's etcd3 section imports it, but the patroni
# package only recommends one DCS library of several, so it is often
# missing) and a PostgreSQL server under /usr/lib/postgresql/*/bin.
# Run as root, the test runs Patroni as the postgres account, which the
# PostgreSQL packages create. Every step checks first: with everything in
# place it changes nothing.

# patroni_python prints the interpreter Patroni runs on (its #! line).
patroni_python() {
	local line
	line=$(head -n 1 "$(command -v patroni)" 2>/dev/null || true)
	case $line in
	'#!'*/env\ *) echo "${line#*/env }" | awk '{ print $1 }' ;;
	'#!'*) echo "${line#\#!}" | awk '{ print $1 }' ;;
	*) echo python3 ;;
	esac
}

setup_patroni() {
	install_postgres
	local missing=()
	command -v patroni >/dev/null || missing+=(patroni)
	if [ "${#missing[@]}" -gt 0 ] || ! "$(patroni_python)" -c 'import etcd' 2>/dev/null; then
		missing+=(python3-etcd)
	fi
	if [ "${#missing[@]}" -eq 0 ]; then
		log "patroni and python3-etcd already installed"
	else
		log "installing ${missing[*]} (apt-get)"
		local out
		out=$(mktemp)
		if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >"$out" 2>&1 ||
			! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
				-o DPkg::Lock::Timeout=300 "${missing[@]}" >>"$out" 2>&1; then
			cat "$out" >&2
			rm -f "$out"
			die "apt-get install ${missing[*]} failed"
		fi
		rm -f "$out"
	fi
	"$(patroni_python)" -c 'import etcd, patroni.dcs.etcd3' ||
		die "Patroni's etcd3 support does not import after installing patroni and python3-etcd"
	if [ "$(id -u)" -eq 0 ]; then
		id postgres >/dev/null 2>&1 || die "no postgres account: TestPatroni runs Patroni as it when run as root"
	fi
}

setup_patroni
