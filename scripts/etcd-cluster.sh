#!/usr/bin/env bash
# A throwaway etcd for dlock's tests, on loopback:
#   - a 3-member plaintext cluster (m1, m2, m3);
#   - one single-member cluster with TLS, client-certificate auth and etcd
#     user auth (user root), whose auth tokens (JWT) expire after
#     DLOCK_TEST_AUTH_TOKEN_TTL seconds (default 3) so re-authentication gets
#     exercised.
# Data, logs, certificates and the sourceable env file live in
# DLOCK_TEST_ETCD_DIR (default target/etcd; an absolute path, or one relative
# to the repository), so several clusters (each on its own
# DLOCK_TEST_PORT_BASE) can run side by side from one checkout.
#
# usage: scripts/etcd-cluster.sh start|stop|status|restart-member N|leader
#   start            install what is missing (Debian), start, wait until
#                    healthy, write target/etcd/env
#   stop             stop every member (also paused or half-started ones),
#                    remove target/etcd/
#   status           the members' health and pids
#   restart-member N kill member N (1..3) if it runs (also when SIGSTOPped),
#                    start it again on its data, wait until healthy, update
#                    the env file; prints the new pid
#   leader           prints the number (1..3) of the current leader
#
# Ports: DLOCK_TEST_PORT_BASE (default 23790) .. base+7: member i's client
# port is base+2(i-1), its peer port the next one; the TLS member uses
# base+6 / base+7.
#
# Timing: --heartbeat-interval 50 --election-timeout 500 (ms): a new leader
# 0.5-1 s after the old one dies. The fault tests (TTL 4 s, keepalive 1 s,
# margin 1 s) leave a holder as little as TTL - margin - interval = 2 s to
# get a keepalive confirmed after a cut; with etcd's defaults (100 / 1000)
# elections took up to 2.5 s here and a leader kill fenced a healthy holder.
set -euo pipefail
cd "$(dirname "$0")/.."

root=$PWD
. scripts/lib.sh
dir=${DLOCK_TEST_ETCD_DIR:-target/etcd}
[[ $dir == /* ]] || dir=$root/$dir
dir=${dir%/}
env_file=$dir/env
base=${DLOCK_TEST_PORT_BASE:-23790}
token_ttl=${DLOCK_TEST_AUTH_TOKEN_TTL:-3}
heartbeat=50
election=500
names=(m1 m2 m3)

die() { echo "etcd-cluster: $*" >&2; exit 1; }
log() { echo "etcd-cluster: $*" >&2; }

[[ $base =~ ^[0-9]+$ ]] && ((base >= 1024 && base + 7 <= 65535)) ||
  die "DLOCK_TEST_PORT_BASE must be a port number from 1024 to 65528, got '$base'"

[[ $token_ttl =~ ^[1-9][0-9]*$ ]] || die "DLOCK_TEST_AUTH_TOKEN_TTL must be whole seconds > 0, got '$token_ttl'"

client_port() { echo $((base + 2 * ($1 - 1))); }
peer_port() { echo $((base + 2 * ($1 - 1) + 1)); }
tls_port=$((base + 6))
tls_peer_port=$((base + 7))
member_url() { echo "http://127.0.0.1:$(client_port "$1")"; }
members() { echo "$(member_url 1),$(member_url 2),$(member_url 3)"; }

ensure_tools() {
  need_debs etcd=etcd-server etcdctl=etcd-client openssl=openssl ss=iproute2 || die "cannot install the cluster's tools"
}

# --- pids ------------------------------------------------------------------
# target/etcd/pid.<name> holds each member's pid, written right after the
# spawn, so `stop` finds every process even after a half-finished start.

# The pid in $dir/pid.$1, if that process is still our etcd.
live_pid() {
  local f=$dir/pid.$1 pid
  [[ -f $f ]] || return 1
  pid=$(<"$f")
  [[ -n $pid && -r /proc/$pid/cmdline ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "--data-dir $dir/$1.data" || return 1
  echo "$pid"
}

# Whether process $1 exists and is not a zombie.
running() {
  local st
  st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n $st && $st != Z ]]
}

# Stops the members named: SIGCONT (one may be paused), SIGTERM, SIGKILL
# for whatever still runs after 3 s.
stop_members() {
  local name pid pids=() i alive
  for name in "$@"; do
    if pid=$(live_pid "$name"); then
      pids+=("$pid")
      kill -CONT "$pid" 2>/dev/null || true
      kill -TERM "$pid" 2>/dev/null || true
    fi
  done
  for ((i = 0; i < 30; i++)); do
    alive=0
    for pid in "${pids[@]}"; do running "$pid" && alive=1; done
    ((alive)) || break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    while running "$pid"; do sleep 0.05; done
  done
  for name in "$@"; do rm -f "$dir/pid.$name"; done
}

# --- certificates -------------------------------------------------------------

gen_certs() {
  local c=$dir/certs
  mkdir -p "$c"
  local ossl="openssl"
  $ossl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$c/ca-key.pem" 2>/dev/null
  $ossl req -x509 -new -key "$c/ca-key.pem" -days 2 -subj "/CN=dlock test CA" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$c/ca.pem" 2>/dev/null
  # $1 name, $2 CN, $3 extensions
  leaf() {
    $ossl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$c/$1-key.pem" 2>/dev/null
    $ossl req -new -key "$c/$1-key.pem" -subj "/CN=$2" -out "$c/$1.csr" 2>/dev/null
    printf '%s\n' "$3" >"$c/$1.ext"
    $ossl x509 -req -in "$c/$1.csr" -CA "$c/ca.pem" -CAkey "$c/ca-key.pem" -CAcreateserial \
      -days 2 -sha256 -extfile "$c/$1.ext" -out "$c/$1.pem" 2>/dev/null
  }
  # The server certificate also says clientAuth: etcd's gRPC gateway dials
  # the member with it.
  leaf server "127.0.0.1" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=IP:127.0.0.1,DNS:localhost"
  # The client's CN is not an etcd user: with client-cert auth etcd would
  # take a CN that names a user as that user, and the tests must show the
  # password is what authenticates.
  leaf client "dlock-client" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"
  # JWT signing key for the auth tokens.
  $ossl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$c/jwt-key.pem" 2>/dev/null
  $ossl pkey -in "$c/jwt-key.pem" -pubout -out "$c/jwt.pem" 2>/dev/null
}

# --- members --------------------------------------------------------------------

# The command line of member $1 (m1..m3 or tls).
member_args() {
  local name=$1 cluster="" i
  case $name in
  m[123])
    i=${name#m}
    for j in 1 2 3; do cluster+="${cluster:+,}m$j=http://127.0.0.1:$(peer_port "$j")"; done
    echo --name "$name" --data-dir "$dir/$name.data" \
      --listen-client-urls "$(member_url "$i")" --advertise-client-urls "$(member_url "$i")" \
      --listen-peer-urls "http://127.0.0.1:$(peer_port "$i")" \
      --initial-advertise-peer-urls "http://127.0.0.1:$(peer_port "$i")" \
      --initial-cluster "$cluster" --initial-cluster-token dlock-test \
      --initial-cluster-state new
    ;;
  tls)
    local c=$dir/certs
    echo --name tls --data-dir "$dir/tls.data" \
      --listen-client-urls "https://127.0.0.1:$tls_port" \
      --advertise-client-urls "https://127.0.0.1:$tls_port" \
      --listen-peer-urls "http://127.0.0.1:$tls_peer_port" \
      --initial-advertise-peer-urls "http://127.0.0.1:$tls_peer_port" \
      --initial-cluster "tls=http://127.0.0.1:$tls_peer_port" --initial-cluster-token dlock-test-tls \
      --initial-cluster-state new \
      --cert-file "$c/server.pem" --key-file "$c/server-key.pem" \
      --trusted-ca-file "$c/ca.pem" --client-cert-auth \
      --auth-token "jwt,pub-key=$c/jwt.pem,priv-key=$c/jwt-key.pem,sign-method=RS256,ttl=${token_ttl}s"
    ;;
  esac
}

start_member() {
  local name=$1
  # shellcheck disable=SC2046 # member_args yields words without blanks
  setsid etcd $(member_args "$name") \
    --heartbeat-interval "$heartbeat" --election-timeout "$election" \
    --logger zap --log-outputs stderr --log-level warn \
    >>"$dir/$name.log" 2>&1 </dev/null &
  echo $! >"$dir/pid.$name"
  disown
}

ctl() { ETCDCTL_API=3 etcdctl --dial-timeout 1s --command-timeout 3s "$@"; }
ctl_tls() {
  ctl --endpoints "https://127.0.0.1:$tls_port" --cacert "$dir/certs/ca.pem" \
    --cert "$dir/certs/client.pem" --key "$dir/certs/client-key.pem" "$@"
}

# Waits up to 30 s until `${@:2}` succeeds; dies naming $1 if it does not.
wait_for() {
  local what=$1
  shift
  poll 30 "$@" || die "$what did not become healthy in 30 s (logs: $dir/*.log)"
}

# Whether `${@:2}` succeeds within $1 seconds (tried every 0.2 s).
poll() {
  local end=$((SECONDS + $1))
  shift
  while ((SECONDS < end)); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  return 1
}

member_healthy() { ctl --endpoints "$(member_url "$1")" endpoint health; }

write_env() {
  local pids=() i tmp
  for i in 1 2 3; do pids+=("$(live_pid "m$i" || echo 0)"); done
  tmp=$(mktemp "$dir/env.XXXXXX")
  cat >"$tmp" <<EOF
export DLOCK_TEST_ETCD=1
export DLOCK_TEST_MEMBERS=$(members)
export DLOCK_TEST_PIDS=$(IFS=,; echo "${pids[*]}")
export DLOCK_TEST_TLS_ENDPOINT=https://127.0.0.1:$tls_port
export DLOCK_TEST_CA=$dir/certs/ca.pem
export DLOCK_TEST_CERT=$dir/certs/client.pem
export DLOCK_TEST_KEY=$dir/certs/client-key.pem
export DLOCK_TEST_USER=root
export DLOCK_TEST_PASSWORD=$(<"$dir/password")
export DLOCK_TEST_AUTH_TOKEN_TTL=$token_ttl
export DLOCK_TEST_PORT_BASE=$base
export DLOCK_TEST_ENV_FILE=$env_file
export DLOCK_TEST_ETCD_DIR=$dir
export DLOCK_TEST_CLUSTER_SCRIPT=$root/scripts/etcd-cluster.sh
EOF
  mv "$tmp" "$env_file"
}

cmd_start() {
  ensure_tools
  if [[ -d $dir ]]; then
    log "stopping a previous cluster"
    cmd_stop
  fi
  local p busy=()
  for ((p = base; p <= base + 7; p++)); do
    ss -Hltn "sport = :$p" | grep -q . && busy+=("$p")
  done
  ((${#busy[@]} == 0)) || die "port(s) ${busy[*]} in use; set DLOCK_TEST_PORT_BASE to a free range"
  mkdir -p "$dir"
  # From here on a failure (or Ctrl-C) stops whatever was started.
  trap 'rc=$?; if ((rc != 0)); then log "start failed; stopping"; cmd_stop; fi' EXIT
  gen_certs
  openssl rand -hex 16 >"$dir/password"
  local name
  for name in "${names[@]}" tls; do start_member "$name"; done
  for i in 1 2 3; do wait_for "member m$i" member_healthy "$i"; done
  wait_for "the 3-member cluster" ctl --endpoints "$(members)" endpoint health --cluster
  wait_for "the TLS member" ctl_tls endpoint health
  ctl_tls user add root --new-user-password "$(<"$dir/password")" --interactive=false >/dev/null
  ctl_tls user grant-role root root >/dev/null
  ctl_tls auth enable >/dev/null
  write_env
  trap - EXIT
  log "started: members $(members), TLS https://127.0.0.1:$tls_port; env in $env_file"
}

cmd_stop() {
  stop_members "${names[@]}" tls
  rm -rf "$dir"
}

cmd_status() {
  [[ -d $dir ]] || { echo "not running"; return 1; }
  local rc=0 name pid state
  for i in 1 2 3; do
    name=m$i
    if pid=$(live_pid "$name"); then
      state=$(awk '{print $3}' "/proc/$pid/stat")
      if [[ $state == T ]]; then
        echo "$name pid $pid $(member_url "$i") paused"
      elif member_healthy "$i" >/dev/null 2>&1; then
        echo "$name pid $pid $(member_url "$i") healthy"
      else
        echo "$name pid $pid $(member_url "$i") unhealthy"; rc=1
      fi
    else
      echo "$name $(member_url "$i") down"; rc=1
    fi
  done
  if pid=$(live_pid tls) && ctl_tls endpoint health >/dev/null 2>&1; then
    echo "tls pid $pid https://127.0.0.1:$tls_port healthy"
  else
    echo "tls https://127.0.0.1:$tls_port down or unhealthy"; rc=1
  fi
  return $rc
}

cmd_restart_member() {
  local i=${1:-}
  [[ $i =~ ^[123]$ ]] || die "restart-member needs a member number 1, 2 or 3"
  [[ -d $dir/m$i.data ]] || die "no cluster in $dir (run start first)"
  local try
  # A restart that is not healthy in 30 s is told (with the end of its log)
  # and tried once more: a CI run once saw a restarted member stay
  # unhealthy for 30 s, which failed its case and, with the member down,
  # the next one. The tests are about dlock, not about etcd's restart.
  for try in 1 2; do
    kill_member "m$i"
    # The data dir exists, so etcd rejoins and ignores --initial-cluster*.
    start_member "m$i"
    if poll 30 member_healthy "$i"; then
      write_env
      live_pid "m$i"
      return 0
    fi
    log "member m$i not healthy 30 s after restart $try of 2 ($(live_pid "m$i" >/dev/null && echo running || echo exited)); the end of $dir/m$i.log:"
    tail -n 15 "$dir/m$i.log" | cut -c1-300 >&2
  done
  die "member m$i did not become healthy after 2 restarts (logs: $dir/*.log)"
}

# Kills member $1 if it runs (also when SIGSTOPped) and waits until it is gone.
kill_member() {
  local pid
  if pid=$(live_pid "$1"); then
    kill -KILL "$pid" 2>/dev/null || true
    while running "$pid"; do sleep 0.05; done
  fi
}

cmd_leader() {
  local out
  out=$(ctl --endpoints "$(members)" endpoint status -w simple 2>/dev/null) || true
  # endpoint, ID, version, db size, is leader, ...
  local line i=0
  while IFS= read -r line; do
    [[ -z $line ]] && continue
    for j in 1 2 3; do
      if [[ $line == "$(member_url "$j"),"* ]] && [[ $(awk -F', ' '{print $5}' <<<"$line") == true ]]; then
        i=$j
      fi
    done
  done <<<"$out"
  ((i > 0)) || die "no leader found"
  echo "$i"
}

case ${1:-} in
start) cmd_start ;;
stop) cmd_stop ;;
status) cmd_status ;;
restart-member) cmd_restart_member "${2:-}" ;;
leader) cmd_leader ;;
*) die "usage: $0 start|stop|status|restart-member N|leader" ;;
esac
