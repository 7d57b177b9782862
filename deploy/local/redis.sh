#!/usr/bin/env bash
# A Redis server (Debian's redis-server) for development and tests, without Docker.
#
#   deploy/local/redis.sh up       start it on SWITCHYARD_REDIS_URL (redis://127.0.0.1:6379/0)
#   deploy/local/redis.sh down     stop it, if this script started it
#   deploy/local/redis.sh status   say whether a server answers
#
# A server already answering on the address is reused and left running by `down`. When
# SWITCHYARD_REDIS_URL names another host, nothing is started: `up` only checks it.
set -euo pipefail
SCRIPT_NAME=redis.sh
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
source "$HERE/lib.sh"

URL="${SWITCHYARD_REDIS_URL:-redis://127.0.0.1:6379/0}"
HOSTPORT="${URL#*://}"
HOSTPORT="${HOSTPORT#*@}"
HOSTPORT="${HOSTPORT%%/*}"
HOST="${HOSTPORT%:*}"
PORT="${HOSTPORT##*:}"
[[ "$PORT" == "$HOSTPORT" ]] && PORT=6379
RUN="$SWITCHYARD_CACHE_DIR/run/redis-$PORT"
PIDFILE="$RUN/redis.pid"
OWNED="$RUN/owned"

usage() { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; }

pong() { [[ "$(redis-cli -h "$HOST" -p "$PORT" ping 2>/dev/null)" == "PONG" ]]; }

up() {
  if ! is_local_host "$HOST"; then
    port_open "$HOST" "$PORT" || die "Redis at $URL does not answer (not local: nothing to start)"
    say "Redis at $HOST:$PORT answers (external, left alone)"
    return 0
  fi
  if port_open "$HOST" "$PORT"; then
    if [[ -f "$OWNED" ]]; then say "Redis at $HOST:$PORT already running (started by this script)"
    else say "Redis at $HOST:$PORT already answers: reusing it"; fi
    return 0
  fi
  command -v redis-server >/dev/null || die "redis-server is missing: run deploy/local/bootstrap.sh (or apt-get install redis-server)"
  mkdir -p "$RUN"
  redis-server --port "$PORT" --bind 127.0.0.1 --daemonize yes --pidfile "$PIDFILE" \
    --dir "$RUN" --logfile "$RUN/redis.log" --save "" --appendonly no >/dev/null
  touch "$OWNED"
  wait_for 20 pong || { tail -n 20 "$RUN/redis.log" >&2 || true; die "Redis did not answer within 20 s"; }
  say "Redis is up at $HOST:$PORT"
}

down() {
  if [[ -f "$OWNED" ]]; then
    say "stopping Redis on $HOST:$PORT"
    redis-cli -h "$HOST" -p "$PORT" shutdown nosave >/dev/null 2>&1 || true
    stop_pid "$PIDFILE" 10
    rm -f "$OWNED"
  elif port_open "$HOST" "$PORT"; then
    say "Redis at $HOST:$PORT was not started by this script: left running"
  fi
}

status() {
  if port_open "$HOST" "$PORT"; then
    if [[ -f "$OWNED" ]]; then say "Redis at $HOST:$PORT: up (started by this script)"
    else say "Redis at $HOST:$PORT: up (not started by this script)"; fi
  else
    say "Redis at $HOST:$PORT: down"
    return 1
  fi
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  -h|--help|help) usage ;;
  *) usage >&2; exit 2 ;;
esac
