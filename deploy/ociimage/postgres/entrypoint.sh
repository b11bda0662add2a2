#!/bin/sh
# The entrypoint of the local PostgreSQL image (scripts/k8s.sh postgres):
# what the postgres image's entrypoint does with the variables the
# manifests set (deploy/kubernetes/common/postgres.yaml): a first start
# initialises PGDATA with the user POSTGRES_USER (password
# POSTGRES_PASSWORD, scram-sha-256 over TCP) and the database POSTGRES_DB;
# every start then runs postgres in the foreground, listening on all
# addresses.
set -eu
: "${PGDATA:?PGDATA is required}"
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  : "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is required to initialise PGDATA}"
  mkdir -p "$PGDATA"
  chmod 700 "$PGDATA"
  pw=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pw"
  initdb -D "$PGDATA" -U "$user" --pwfile="$pw" -E UTF8 --locale=C.UTF-8 \
    --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$pw"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  if [ "$db" != postgres ]; then
    echo "CREATE DATABASE \"$db\" OWNER \"$user\"" | postgres --single -D "$PGDATA" postgres >/dev/null
  fi
  echo "entrypoint: initialised $PGDATA (user $user, database $db)"
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/var/run/postgresql
