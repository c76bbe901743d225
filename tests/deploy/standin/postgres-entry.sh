#!/bin/sh
# First start: a cluster whose superuser is POSTGRES_USER (password auth from other hosts)
# and a database POSTGRES_DB, as the official image's entry point makes; then Postgres.
set -e
mkdir -p "$PGDATA" /run/postgresql
chown -R postgres "$PGDATA" /run/postgresql
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    printf '%s\n' "$POSTGRES_PASSWORD" >/tmp/pw && chown postgres /tmp/pw
    su postgres -c "initdb -U '$POSTGRES_USER' --pwfile=/tmp/pw -A scram-sha-256 -D '$PGDATA'" >/dev/null
    rm /tmp/pw
    echo "host all all 0.0.0.0/0 scram-sha-256" >>"$PGDATA/pg_hba.conf"
    su postgres -c "pg_ctl -D '$PGDATA' -o '-c listen_addresses=' -w start" >/dev/null
    su postgres -c "PGPASSWORD='$POSTGRES_PASSWORD' psql -q -U '$POSTGRES_USER' -d postgres -c 'CREATE DATABASE \"$POSTGRES_DB\"'"
    su postgres -c "pg_ctl -D '$PGDATA' -w stop" >/dev/null
fi
exec su postgres -c "exec postgres -D '$PGDATA' -c listen_addresses='*'"
