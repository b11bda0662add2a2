#!/usr/bin/env bash
# Starts a throwaway PostgreSQL cluster for tests and development and prints
# its DSN (the only thing on stdout). Idempotent: a second run finds the
# cluster running and prints the same DSN.
#
#   scripts/postgres.sh            start (installing postgresql from apt if missing)
#   scripts/postgres.sh stop       stop the cluster
#   scripts/postgres.sh destroy    stop it and remove its directory
#
# Environment:
#   SPACE_PG_DIR         cluster directory (default /tmp/space-pg; keep it short:
#                        the unix socket lives in it)
#   SPACE_PG_PORT        port (default 55432); the server listens on the unix
#                        socket in SPACE_PG_DIR and on 127.0.0.1
#   SPACE_PG_DB          database created for SPACE (default space)
#   SPACE_PG_NO_INSTALL  1: fail instead of running apt-get when postgresql is missing
#
# Authentication is "trust" for local connections: this cluster is for tests,
# never for production (docs/install-systemd.md covers a real database).
# The server refuses to run as root, so as root everything runs as the
# `postgres` user (created by the Debian package).
set -euo pipefail

dir=${SPACE_PG_DIR:-/tmp/space-pg}
port=${SPACE_PG_PORT:-55432}
db=${SPACE_PG_DB:-space}
cmd=${1:-start}

log() { echo "postgres.sh: $*" >&2; }

bindir() {
	local d
	for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
		if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then
			echo "$d"
			return 0
		fi
	done
	return 1
}

# as runs a command as the cluster's owner: postgres when we are root, else ourselves.
as() {
	if [ "$(id -u)" = 0 ]; then
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

if ! bin=$(bindir); then
	if [ "${SPACE_PG_NO_INSTALL:-0}" = 1 ]; then
		log "postgresql is not installed (apt-get install postgresql)"
		exit 2
	fi
	if [ "$(id -u)" != 0 ]; then
		log "postgresql is not installed and we are not root to install it"
		exit 2
	fi
	log "installing postgresql from apt"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq >&2
	# policy-rc.d-style: the package's own cluster is not needed; ours is separate.
	apt-get install -y -qq postgresql >&2
	bin=$(bindir)
fi

data=$dir/data
pgctl() { as "$bin/pg_ctl" -D "$data" "$@"; }

case $cmd in
stop)
	if [ -f "$data/postmaster.pid" ]; then pgctl stop -m fast -w >&2 || true; fi
	exit 0
	;;
destroy)
	if [ -f "$data/postmaster.pid" ]; then pgctl stop -m immediate -w >&2 || true; fi
	rm -rf "$dir" "$dir.lock"
	exit 0
	;;
start) ;;
*)
	log "usage: $0 [start|stop|destroy]"
	exit 2
	;;
esac

# Concurrent runs (test packages start in parallel) wait for each other.
exec 9>"$dir.lock"
flock 9

mkdir -p "$dir"
chmod 0755 "$dir"
if [ "$(id -u)" = 0 ]; then chown postgres: "$dir"; fi

if [ ! -f "$data/PG_VERSION" ]; then
	log "initdb $data"
	rm -rf "$data"
	as "$bin/initdb" -D "$data" -U postgres -A trust -E UTF8 --locale=C.UTF-8 --no-sync >"$dir/initdb.log" 2>&1 || {
		cat "$dir/initdb.log" >&2
		exit 1
	}
fi

if ! pgctl status >/dev/null 2>&1; then
	log "starting on $dir/.s.PGSQL.$port and 127.0.0.1:$port"
	# A crashed run may leave a stale pid file; pg_ctl handles that itself.
	# 9>&-: the server must not inherit (and so hold for ever) the lock.
	pgctl start -w -t 60 -l "$dir/server.log" \
		-o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" 9>&- >&2 || {
		tail -n 30 "$dir/server.log" >&2
		exit 1
	}
fi

psql=("$bin/psql" -X -q -h "$dir" -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1)
ready() {
	local i
	for i in $(seq 1 50); do
		if as "${psql[@]}" -tAc 'SELECT 1' >/dev/null 2>&1; then return 0; fi
		sleep 0.1
	done
	return 1
}
if ! ready; then
	# A postmaster that was killed (or was still dying when we looked) leaves
	# a stale pid file; start once more, then give up loudly.
	log "not answering; starting again"
	pgctl start -w -t 60 -l "$dir/server.log" \
		-o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" 9>&- >&2 || true
	if ! ready; then
		tail -n 30 "$dir/server.log" >&2
		log "PostgreSQL does not answer on $dir/.s.PGSQL.$port"
		exit 1
	fi
fi
if [ "$(as "${psql[@]}" -tAc "SELECT 1 FROM pg_database WHERE datname='$db'")" != 1 ]; then
	as "${psql[@]}" -c "CREATE DATABASE \"$db\"" >&2 || true # a concurrent run may have made it
fi

echo "postgres://postgres@127.0.0.1:$port/$db?sslmode=disable"
