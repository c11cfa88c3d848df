# A throwaway PostgreSQL cluster for the tests: sourced by .ci/run (and usable by hand:
# `source .ci/postgres.sh && start_postgres`). Installs the distribution's server if it is
# missing, runs it as a non-root user in a temporary directory on a free loopback port,
# exports its URL as IDEM_TEST_POSTGRES_URL, and `stop_postgres` removes it all.

pg_bin() {
    local dir
    for dir in $(command -v initdb >/dev/null && dirname "$(readlink -f "$(command -v initdb)")") \
               /usr/lib/postgresql/*/bin; do
        if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then
            echo "$dir"
            return 0
        fi
    done
    return 1
}

start_postgres() {
    if ! PG_BIN="$(pg_bin)"; then
        echo "postgres: installing the distribution's server"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null \
            || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null; }
        PG_BIN="$(pg_bin)"
    fi
    PG_DIR="$(mktemp -d /tmp/idem-pg.XXXXXX)"
    PG_PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    # PostgreSQL refuses to run as root: a user of its own when CI runs as root.
    PG_USER="$(id -un)"
    if [ "$(id -u)" = 0 ]; then
        PG_USER=idem-pg
        id "$PG_USER" >/dev/null 2>&1 || useradd --system --no-create-home "$PG_USER"
        chown "$PG_USER" "$PG_DIR"
    fi
    as_pg() { if [ "$(id -u)" = 0 ]; then su -s /bin/sh "$PG_USER" -c "$*"; else sh -c "$*"; fi; }
    as_pg "$PG_BIN/initdb -D $PG_DIR/data -U idem --auth=trust -E UTF8 >$PG_DIR/initdb.log 2>&1"
    local start="$PG_BIN/pg_ctl -D $PG_DIR/data -l $PG_DIR/server.log -w -o '-h 127.0.0.1 -p $PG_PORT -k $PG_DIR -c max_connections=300' start"
    local stop="$PG_BIN/pg_ctl -D $PG_DIR/data -m fast -w stop"
    if [ "$(id -u)" = 0 ]; then
        start="su -s /bin/sh $PG_USER -c \"$start\""
        stop="su -s /bin/sh $PG_USER -c \"$stop\""
    fi
    sh -c "$start" >/dev/null
    export IDEM_TEST_POSTGRES_URL="postgres://idem@127.0.0.1:$PG_PORT/postgres"
    # For the test that restarts the server under running replicas.
    export IDEM_TEST_POSTGRES_START="$start" IDEM_TEST_POSTGRES_STOP="$stop"
    echo "postgres: $IDEM_TEST_POSTGRES_URL (cluster in $PG_DIR, user $PG_USER)"
}

stop_postgres() {
    [ -n "${PG_DIR:-}" ] || return 0
    as_pg "$PG_BIN/pg_ctl -D $PG_DIR/data -m immediate stop >/dev/null 2>&1" || true
    rm -rf "$PG_DIR"
    PG_DIR=
}
