# A throwaway PostgreSQL cluster for the pair and statement scripts
# (bench/shared-meta-pairs.sh, bench/shared-stmts.sh); run.sh's section 16
# has its own in bench/shared.sh, with the run's logging. Source it, then:
#   pg_start DIR [-c setting=value ...]   initdb in DIR/pg as the postgres
#       user, start the server on a free loopback port, wait until it
#       answers; sets PG_PORT and PG_PID; its log is DIR/pg.log
#   pg_psql SQL                           one statement as postgres
#   pg_stop                               stop it (fast shutdown) and wait
# DIR must be reachable by the postgres user (chmod 711).

pg_start() {
    local dir=$1; shift
    local bin
    bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | tail -1)
    [[ -x $bin/initdb ]] || { echo "needs PostgreSQL's server: apt-get install -y postgresql" >&2; return 1; }
    mkdir -p "$dir/pg/sock"; chown -R postgres:postgres "$dir/pg"
    runuser -u postgres -- "$bin/initdb" -D "$dir/pg/data" -A trust -U postgres -E UTF8 --locale=C --no-sync > /dev/null
    PG_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    setpriv --reuid=postgres --regid=postgres --init-groups -- "$bin/postgres" -D "$dir/pg/data" -c listen_addresses=127.0.0.1 \
        -p "$PG_PORT" -c "unix_socket_directories=$dir/pg/sock" -c max_connections=200 "$@" > "$dir/pg.log" 2>&1 &
    PG_PID=$!
    local i
    for i in $(seq 100); do pg_psql 'SELECT 1' > /dev/null 2>&1 && return 0; sleep 0.1; done
    tail -n 20 "$dir/pg.log" >&2; echo "postgres did not answer on port $PG_PORT" >&2; return 1
}

pg_psql() {
    psql -X -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -c "$1"
}

pg_stop() {
    [[ -n ${PG_PID:-} ]] || return 0
    kill -INT "$PG_PID" 2>/dev/null; wait "$PG_PID" 2>/dev/null || true; PG_PID=
}
