#!/usr/bin/env bash
# A throwaway PostgreSQL for dlock's tests, on loopback (Debian's
# PostgreSQL 15, run as the `postgres` user since initdb refuses root):
#   - a primary (port base) with a synchronous standby (port base+1, made
#     by `pg_basebackup -R`; `synchronous_standby_names = 'standby1'`,
#     `synchronous_commit = on`);
#   - a lone server (port base+2) without any standby, which dlock must
#     refuse unless told it is a single node;
#   - SCRAM password authentication for the test user `dlock` on all of
#     them; a role `dlock_nocreate` that may connect but not create the
#     dlock schema;
#   - TLS on the lone server (a test CA in $dir/certs), where the role
#     `dlock_tls` may only connect over TLS;
#   - an asynchronous standby of the lone server (port base+4), for the
#     test that shows why dlock refuses asynchronous replication
#     (core/tests/postgres_async.rs detaches and promotes it);
#   - PgBouncer (Debian's pgbouncer, 1.18) in transaction pool mode in
#     front of the primary's database `dlock` (port base+3), SCRAM for the
#     user `dlock` (its secret copied from the primary: no plaintext
#     password on disk); its URL is DLOCK_TEST_PG_BOUNCER_URL;
#   - a lone server with a steppable wall clock (port base+5, libfaketime;
#     DLOCK_TEST_PG_STEPPED_URL, the offset file DLOCK_TEST_PG_STEPPED_OFFSET)
#     for the measurement of a clock step on the database host.
# Data, logs and the sourceable env file live in DLOCK_TEST_PG_DIR (default
# target/pg; an absolute path, or one relative to the repository), so
# several clusters (each on its own DLOCK_TEST_PG_PORT_BASE) can run from
# one checkout.
#
# usage: scripts/pg-cluster.sh start|stop|status|promote|restart [NAME]|psql [ARGS]
#   start    install what is missing (Debian), init, start, wait until the
#            standby streams synchronously, write $dir/env
#   stop     stop every server and PgBouncer (also paused ones), remove $dir
#   status   each server's state
#   promote  kill the primary, promote the standby (its URL is in the env
#            file as DLOCK_TEST_PG_STANDBY_URL)
#   restart  restart server NAME (default primary) with a fast shutdown:
#            every connection cut, the data kept
#   psql     psql as the superuser on the primary, with ARGS
#
# Ports: DLOCK_TEST_PG_PORT_BASE (default 25430) .. base+5: primary,
# standby, lone, PgBouncer, the lone server's asynchronous standby, the
# stepped server.
set -euo pipefail
cd "$(dirname "$0")/.."

root=$PWD
. scripts/lib.sh
dir=${DLOCK_TEST_PG_DIR:-target/pg}
[[ $dir == /* ]] || dir=$root/$dir
dir=${dir%/}
# The servers run as the postgres user, which may not reach into the
# checkout (a clone under a mode-700 folder such as root's home). Then the
# files live in a folder of their own under /tmp and $dir is a link to it
# (see cmd_start); every command follows the link.
link=$dir
[[ -L $dir ]] && dir=$(readlink -f "$dir")
env_file=$dir/env
base=${DLOCK_TEST_PG_PORT_BASE:-25430}
ver=15
bin=/usr/lib/postgresql/$ver/bin
names=(primary standby lone async stepped)

die() { echo "pg-cluster: $*" >&2; exit 1; }
log() { echo "pg-cluster: $*" >&2; }

last=5 # the highest port is base+last
[[ $base =~ ^[0-9]+$ ]] && ((base >= 1024 && base + last <= 65535)) ||
  die "DLOCK_TEST_PG_PORT_BASE must be a port number from 1024 to $((65535 - last)), got '$base'"

port_of() {
  case $1 in
  primary) echo "$base" ;; standby) echo $((base + 1)) ;; lone) echo $((base + 2)) ;; bouncer) echo $((base + 3)) ;; async) echo $((base + 4)) ;; stepped) echo $((base + 5)) ;;
  esac
}

# Runs as the postgres user when we are root (initdb refuses root).
as_pg() {
  # From /: the caller's folder may be one the postgres user cannot enter
  # (every path given here is absolute).
  if ((EUID == 0)); then (cd / && runuser -u postgres -- "$@"); else "$@"; fi
}

ensure_tools() {
  need_debs "$bin/initdb=postgresql-$ver" /usr/sbin/pgbouncer=pgbouncer ss=iproute2 openssl=openssl faketime=faketime ||
    die "cannot install PostgreSQL $ver and PgBouncer"
  if ((EUID == 0)); then
    id postgres >/dev/null 2>&1 || die "no postgres user (the postgresql-$ver package makes it)"
  fi
}

pg_ctl_of() { as_pg "$bin/pg_ctl" -D "$dir/$1" -w -t 30 "${@:2}"; }

# The superuser's psql on server $1 (over the socket directory).
sql() {
  local name=$1
  shift
  as_pg "$bin/psql" -X -q -v ON_ERROR_STOP=1 -h "$dir/sock" -p "$(port_of "$name")" -U postgres -d postgres "$@"
}

conf() {
  cat <<EOF
listen_addresses = '127.0.0.1'
port = $(port_of "$1")
unix_socket_directories = '$dir/sock'
max_connections = 200
password_encryption = 'scram-sha-256'
wal_level = replica
max_wal_senders = 5
hot_standby = on
fsync = off
full_page_writes = off
log_min_messages = warning
log_line_prefix = '%m [%p] '
EOF
}

hba() {
  cat <<EOF
local all postgres trust
local replication postgres trust
host replication postgres 127.0.0.1/32 trust
host all postgres 127.0.0.1/32 trust
host all all 127.0.0.1/32 scram-sha-256
EOF
}

init_server() {
  local name=$1
  as_pg "$bin/initdb" -D "$dir/$name" -U postgres --auth=trust --no-sync -E UTF8 --locale=C.UTF-8 >"$dir/$name.init.log" 2>&1 ||
    die "initdb $name failed: $(tail -5 "$dir/$name.init.log")"
  conf "$name" | as_pg tee -a "$dir/$name/postgresql.conf" >/dev/null
  hba | as_pg tee "$dir/$name/pg_hba.conf" >/dev/null
}

start_server() { pg_ctl_of "$1" -l "$dir/$1.log" start >/dev/null; }

# The stepped server: a lone server whose wall clock (clock_timestamp(),
# what decides a lease's expiry) runs at the offset written in
# $dir/stepped.offset (libfaketime's format, `+0`, `+3`: seconds), read
# again at every call; its monotonic clock is left alone. A test steps the
# database host's clock by writing the file (core/tests/postgres_clockstep.rs).
start_stepped() {
  local lib
  lib=$(dpkg -L libfaketime | grep -m1 '/libfaketimeMT\.so\.1$') || die "no libfaketimeMT.so.1 (package libfaketime)"
  echo "+0" >"$dir/stepped.offset"
  chmod 666 "$dir/stepped.offset"
  init_server stepped
  as_pg env LD_PRELOAD="$lib" FAKETIME_TIMESTAMP_FILE="$dir/stepped.offset" FAKETIME_NO_CACHE=1 \
    FAKETIME_DONT_FAKE_MONOTONIC=1 "$bin/pg_ctl" -D "$dir/stepped" -w -t 30 -l "$dir/stepped.log" start >/dev/null
  users stepped
}

# A CA and a server certificate for 127.0.0.1 (the lone server's TLS), and
# a second CA that signed nothing (a wrong CA).
gen_certs() {
  local c=$dir/certs
  mkdir -p "$c"
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$c/ca-key.pem" 2>/dev/null
  openssl req -x509 -new -key "$c/ca-key.pem" -days 2 -subj "/CN=dlock test CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$c/ca.pem" 2>/dev/null
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$c/other-ca-key.pem" 2>/dev/null
  openssl req -x509 -new -key "$c/other-ca-key.pem" -days 2 -subj "/CN=another CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$c/other-ca.pem" 2>/dev/null
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$c/server-key.pem" 2>/dev/null
  openssl req -new -key "$c/server-key.pem" -subj "/CN=127.0.0.1" -out "$c/server.csr" 2>/dev/null
  printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
    "extendedKeyUsage=serverAuth" "subjectAltName=IP:127.0.0.1,DNS:localhost" >"$c/server.ext"
  openssl x509 -req -in "$c/server.csr" -CA "$c/ca.pem" -CAkey "$c/ca-key.pem" -CAcreateserial \
    -days 2 -sha256 -extfile "$c/server.ext" -out "$c/server.pem" 2>/dev/null
  chmod 644 "$c"/*.pem
  if ((EUID == 0)); then chown postgres: "$c/server-key.pem"; fi
  chmod 600 "$c/server-key.pem"
}

users() {
  sql "$1" <<EOF
CREATE ROLE dlock LOGIN PASSWORD '$(<"$dir/password")';
CREATE DATABASE dlock OWNER dlock;
CREATE ROLE dlock_nocreate LOGIN PASSWORD '$(<"$dir/password")';
CREATE DATABASE dlock_empty;
CREATE ROLE dlock_tls LOGIN PASSWORD '$(<"$dir/password")';
CREATE DATABASE dlock_tls OWNER dlock_tls;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
EOF
}

url() { echo "postgresql://${2:-dlock}:$(<"$dir/password")@127.0.0.1:$(port_of "$1")/${3:-dlock}"; }

# PgBouncer in transaction pool mode in front of the primary's database
# dlock, run as the postgres user (it refuses root). Clients authenticate
# with SCRAM against the role's secret, copied from the primary; PgBouncer
# logs in to the primary with the client's SCRAM keys (pass-through).
start_bouncer() {
  local b=$dir/bouncer secret
  mkdir -p "$b"
  secret=$(sql primary -tA -c "SELECT rolpassword FROM pg_authid WHERE rolname = 'dlock'")
  [[ $secret == SCRAM-SHA-256* ]] || die "no SCRAM secret for the role dlock"
  printf '"dlock" "%s"\n' "$secret" >"$b/userlist.txt"
  cat >"$b/pgbouncer.ini" <<EOF
[databases]
dlock = host=127.0.0.1 port=$(port_of primary) dbname=dlock

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $(port_of bouncer)
unix_socket_dir =
auth_type = scram-sha-256
auth_file = $b/userlist.txt
pool_mode = transaction
max_client_conn = 400
default_pool_size = 40
server_reset_query =
ignore_startup_parameters = extra_float_digits
logfile = $dir/bouncer.log
pidfile = $b/pgbouncer.pid
log_connections = 0
log_disconnections = 0
EOF
  chmod 600 "$b/userlist.txt"
  ((EUID == 0)) && chown -R postgres: "$b"
  as_pg /usr/sbin/pgbouncer -d -q "$b/pgbouncer.ini" || die "PgBouncer did not start: $(tail -5 "$dir/bouncer.log" 2>/dev/null)"
}

bouncer_up() { ss -Hltn "sport = :$(port_of bouncer)" | grep -q .; }

write_env() {
  local tmp
  tmp=$(mktemp "$dir/env.XXXXXX")
  cat >"$tmp" <<EOF
export DLOCK_TEST_PG=1
export DLOCK_TEST_PG_URL=$(url primary)
export DLOCK_TEST_PG_STANDBY_URL=$(url standby)
export DLOCK_TEST_PG_LONE_URL=$(url lone)
export DLOCK_TEST_PG_BOUNCER_URL=$(url bouncer)
export DLOCK_TEST_PG_ASYNC_URL=$(url async)
export DLOCK_TEST_PG_STEPPED_URL=$(url stepped)
export DLOCK_TEST_PG_STEPPED_OFFSET=$dir/stepped.offset
export DLOCK_TEST_PG_NOCREATE_URL=$(url lone dlock_nocreate dlock_empty)
export DLOCK_TEST_PG_TLS_URL=$(url lone dlock_tls dlock_tls)
export DLOCK_TEST_PG_CA=$dir/certs/ca.pem
export DLOCK_TEST_PG_OTHER_CA=$dir/certs/other-ca.pem
export DLOCK_TEST_PG_PASSWORD=$(<"$dir/password")
export DLOCK_TEST_PG_PORT_BASE=$base
export DLOCK_TEST_PG_SCRIPT=$root/scripts/pg-cluster.sh
export DLOCK_TEST_PG_DIR=$dir
EOF
  chmod 644 "$tmp"
  mv "$tmp" "$env_file"
}

# Waits up to 30 s until `$@` succeeds.
wait_for() {
  local what=$1 end=$((SECONDS + 30))
  shift
  while ((SECONDS < end)); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  die "$what did not come up in 30 s (logs: $dir/*.log)"
}

streaming_async() {
  [[ $(sql lone -tA -c "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'async1' AND state = 'streaming'") == async ]]
}

streaming_sync() {
  [[ $(sql primary -tA -c "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby1'") == sync ]]
}

cmd_start() {
  ensure_tools
  if [[ -d $dir ]]; then
    log "stopping a previous cluster"
    cmd_stop
  fi
  dir=$link env_file=$link/env
  local p busy=()
  for ((p = base; p <= base + last; p++)); do
    ss -Hltn "sport = :$p" | grep -q . && busy+=("$p")
  done
  ((${#busy[@]} == 0)) || die "port(s) ${busy[*]} in use; set DLOCK_TEST_PG_PORT_BASE to a free range"
  if ((EUID == 0)) && ! runuser -u postgres -- test -x "$(dirname "$dir")" 2>/dev/null; then
    rm -f "$link"
    dir=$(mktemp -d "${TMPDIR:-/tmp}/dlock-pg.XXXXXX")
    chmod 755 "$dir"
    ln -sfn "$dir" "$link"
    env_file=$dir/env
    log "the postgres user cannot reach $(dirname "$link"): data in $dir ($link links to it)"
  fi
  mkdir -p "$dir/sock"
  ((EUID == 0)) && chown postgres: "$dir" "$dir/sock"
  trap 'rc=$?; if ((rc != 0)); then log "start failed; stopping"; cmd_stop; fi' EXIT
  openssl rand -hex 16 >"$dir/password"
  chmod 644 "$dir/password"
  gen_certs

  init_server primary
  start_server primary
  users primary
  # Synchronous from here on: every commit waits for the standby.
  sql primary -c "ALTER SYSTEM SET synchronous_standby_names = 'standby1'" \
    -c "ALTER SYSTEM SET synchronous_commit = on" -c "SELECT pg_reload_conf()" >/dev/null

  as_pg "$bin/pg_basebackup" -h "$dir/sock" -p "$(port_of primary)" -U postgres -D "$dir/standby" -R -X stream --checkpoint=fast \
    >"$dir/standby.init.log" 2>&1 || die "pg_basebackup failed: $(tail -5 "$dir/standby.init.log")"
  # Replaces the copied ALTER SYSTEM file (the standby has no standby).
  cat <<EOF | as_pg tee "$dir/standby/postgresql.auto.conf" >/dev/null
port = $(port_of standby)
primary_conninfo = 'host=$dir/sock port=$(port_of primary) user=postgres application_name=standby1'
EOF
  start_server standby
  wait_for "synchronous streaming to the standby" streaming_sync

  init_server lone
  # TLS on the lone server; the role dlock_tls may only come over TLS.
  cat <<EOF | as_pg tee -a "$dir/lone/postgresql.conf" >/dev/null
ssl = on
ssl_cert_file = '$dir/certs/server.pem'
ssl_key_file = '$dir/certs/server-key.pem'
EOF
  { printf '%s\n' "hostssl all dlock_tls 127.0.0.1/32 scram-sha-256" "host all dlock_tls 127.0.0.1/32 reject"; hba; } |
    as_pg tee "$dir/lone/pg_hba.conf" >/dev/null
  start_server lone
  users lone
  # The lone server's asynchronous standby (it names no synchronous one).
  as_pg "$bin/pg_basebackup" -h "$dir/sock" -p "$(port_of lone)" -U postgres -D "$dir/async" -R -X stream --checkpoint=fast \
    >"$dir/async.init.log" 2>&1 || die "pg_basebackup of the lone server failed: $(tail -5 "$dir/async.init.log")"
  cat <<EOF | as_pg tee "$dir/async/postgresql.auto.conf" >/dev/null
port = $(port_of async)
primary_conninfo = 'host=$dir/sock port=$(port_of lone) user=postgres application_name=async1'
EOF
  start_server async
  wait_for "asynchronous streaming to the lone server's standby" streaming_async
  start_stepped
  start_bouncer
  wait_for "PgBouncer" bouncer_up
  write_env
  trap - EXIT
  log "started: primary :$(port_of primary) (sync standby :$(port_of standby)), lone :$(port_of lone)," \
    "PgBouncer :$(port_of bouncer) (transaction mode, to the primary)," \
    "async standby of lone :$(port_of async), stepped clock :$(port_of stepped); env in $env_file"
}

postmaster_pid() { head -1 "$dir/$1/postmaster.pid" 2>/dev/null; }

cmd_stop() {
  local name pid
  [[ -d $dir ]] || { [[ ! -L $link ]] || rm -f "$link"; return 0; }
  # Only a directory this script made (DLOCK_TEST_PG_DIR may point anywhere).
  [[ -e $dir/password || -z $(ls -A "$dir") ]] ||
    die "$dir is not a pg-cluster directory (no $dir/password); not removing it"
  for name in "${names[@]}"; do
    [[ -d $dir/$name ]] || continue
    if pid=$(postmaster_pid "$name") && [[ -n $pid ]]; then
      kill -CONT "$pid" 2>/dev/null || true
      pg_ctl_of "$name" -m immediate stop >/dev/null 2>&1 || kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  if pid=$(head -1 "$dir/bouncer/pgbouncer.pid" 2>/dev/null) && [[ -n $pid ]]; then
    kill -CONT "$pid" 2>/dev/null || true
    kill -TERM "$pid" 2>/dev/null || true
    local i
    for ((i = 0; i < 50; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -rf "$dir"
  [[ -L $link ]] && rm -f "$link"
  return 0
}

cmd_status() {
  [[ -d $dir ]] || { echo "not running"; return 1; }
  local rc=0 name
  for name in "${names[@]}"; do
    if as_pg "$bin/pg_isready" -q -h 127.0.0.1 -p "$(port_of "$name")"; then
      echo "$name :$(port_of "$name") up, in recovery: $(sql "$name" -tA -c 'SELECT pg_is_in_recovery()')"
    else
      echo "$name :$(port_of "$name") down"; rc=1
    fi
  done
  if bouncer_up; then
    echo "bouncer :$(port_of bouncer) up (PgBouncer, transaction mode, to the primary)"
  else
    echo "bouncer :$(port_of bouncer) down"; rc=1
  fi
  return $rc
}

cmd_promote() {
  [[ -d $dir/standby ]] || die "no cluster in $dir (run start first)"
  local pid
  if pid=$(postmaster_pid primary) && [[ -n $pid ]]; then
    kill -KILL "$pid" 2>/dev/null || true
  fi
  pg_ctl_of standby promote >/dev/null
  log "standby promoted on :$(port_of standby)"
}

# Restarts server $1 (default primary) with a fast shutdown: every
# connection is cut, the data stays.
cmd_restart() {
  local name=${1:-primary}
  [[ -d $dir/$name ]] || die "no server $name in $dir (run start first)"
  pg_ctl_of "$name" -m fast -l "$dir/$name.log" restart >/dev/null
  log "$name restarted on :$(port_of "$name")"
}

case ${1:-} in
start) cmd_start ;;
stop) cmd_stop ;;
status) cmd_status ;;
promote) cmd_promote ;;
restart) cmd_restart "${2:-primary}" ;;
psql) shift; sql primary "$@" ;;
*) die "usage: $0 start|stop|status|promote|restart [NAME]|psql [ARGS]" ;;
esac
