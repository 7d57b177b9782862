#!/usr/bin/env bash
# A Redis server (Debian's redis-server) for development and tests, without Docker.
#
#   deploy/local/redis.sh up       start it on SWITCHYARD_REDIS_URL (redis://127.0.0.1:6379/0)
#   deploy/local/redis.sh down     stop it, if this script started it
#   deploy/local/redis.sh status   say whether a server answers
#
# A server already answering on the address is reused and left running by `down`. When
# SWITCHYARD_REDIS_URL names another host, nothing is started: `up` only checks it.
# When `up` starts the server and SWITCHYARD_INFRA_RECORD names a file, it appends "redis".
# Its run directory (pid, log, append-only file) is
# ${SWITCHYARD_CACHE_DIR:-~/.cache/switchyard}/run/redis-PORT.
#
# Persistence: the append-only file, fsynced every second (REDIS_PERSISTENCE=aof, the
# default, as docker-compose.yml runs it): a killed or restarted server comes back with
# everything but its last second of writes. REDIS_PERSISTENCE=none keeps nothing.
set -euo pipefail
SCRIPT_NAME=redis.sh
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
source "$HERE/lib.sh"

URL="${SWITCHYARD_REDIS_URL:-redis://127.0.0.1:6379/0}"
HOSTPORT="${URL#*://}"
HOSTPORT="${HOSTPORT#*@}"
HOSTPORT="${HOSTPORT%%/*}"
HOSTPORT="${HOSTPORT%%\?*}"
HOST="${HOSTPORT%:*}"
PORT="${HOSTPORT##*:}"
[[ "$PORT" == "$HOSTPORT" ]] && PORT=6379
[[ -n "$HOST" && "$PORT" =~ ^[0-9]+$ ]] || die "cannot read host:port from SWITCHYARD_REDIS_URL=$URL"
RUN="$SWITCHYARD_CACHE_DIR/run/redis-$PORT"
case "${REDIS_PERSISTENCE:-aof}" in
  aof) PERSISTENCE=(--appendonly yes --appendfsync everysec --save "") ;;
  none) PERSISTENCE=(--appendonly no --save "") ;;
  *) die "REDIS_PERSISTENCE must be aof or none, not ${REDIS_PERSISTENCE}" ;;
esac
PIDFILE="$RUN/redis.pid"
OWNED="$RUN/owned"
LOG="$RUN/redis.log"

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }

pong() { [[ "$(timeout 5 redis-cli -h "$HOST" -p "$PORT" ping 2>/dev/null)" == "PONG" ]]; }

# An external server: PING it when redis-cli is here, else try the port (5 s at most).
reachable() {
  if command -v redis-cli >/dev/null; then
    [[ "$(timeout 5 redis-cli -u "$URL" ping 2>/dev/null)" == "PONG" ]]
  else timeout 5 bash -c '(exec 3<>"/dev/tcp/$0/$1")' "$HOST" "$PORT" >/dev/null 2>&1; fi
}

# True when the pid file names a live redis-server on our port (not a stale or reused pid).
ours_alive() {
  local pid
  [[ -f "$PIDFILE" ]] || return 1
  pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qE "redis-server .*:$PORT( |$)"
}

drop_stale_marker() {
  if [[ -f "$OWNED" ]] && ! ours_alive; then
    rm -f "$OWNED" "$PIDFILE"
  fi
}

up() {
  if ! is_local_host "$HOST"; then
    reachable || die "Redis at $HOST:$PORT does not answer (not a local address: nothing to start)"
    say "Redis at $HOST:$PORT answers (external, left alone)"
    return 0
  fi
  drop_stale_marker
  if port_open "$HOST" "$PORT"; then
    if [[ -f "$OWNED" ]]; then say "Redis at $HOST:$PORT already running (started earlier by this script, pid $(cat "$PIDFILE"))"
    else say "Redis at $HOST:$PORT already answers: reusing it"; fi
    return 0
  fi
  command -v redis-server >/dev/null \
    || die "redis-server is missing: run deploy/local/bootstrap.sh (or apt-get install redis-server)"
  mkdir -p "$RUN"
  rm -f "$PIDFILE"
  : >"$LOG"
  say "starting Redis on $HOST:$PORT (persistence: ${REDIS_PERSISTENCE:-aof})"
  if ! redis-server --port "$PORT" --bind 127.0.0.1 --daemonize yes --pidfile "$PIDFILE" \
    --dir "$RUN" --logfile "$LOG" "${PERSISTENCE[@]}" </dev/null >>"$LOG" 2>&1; then
    tail -n 30 "$LOG" >&2 || true
    die "redis-server refused to start"
  fi
  touch "$OWNED"
  if ! wait_for 20 pong; then
    say "Redis did not answer within 20 s; last lines of $LOG:"
    tail -n 30 "$LOG" >&2 || true
    stop_pid "$PIDFILE" 5
    rm -f "$OWNED"
    exit 1
  fi
  if [[ -n "${SWITCHYARD_INFRA_RECORD:-}" ]]; then echo redis >>"$SWITCHYARD_INFRA_RECORD"; fi
  say "Redis is up at $HOST:$PORT (pid $(cat "$PIDFILE"), log $LOG)"
}

down() {
  is_local_host "$HOST" || { say "Redis at $HOST:$PORT is external: left alone"; return 0; }
  drop_stale_marker
  if [[ -f "$OWNED" ]]; then
    say "stopping Redis on $HOST:$PORT (pid $(cat "$PIDFILE"))"
    # SIGTERM: the server fsyncs its append-only file and exits (no snapshot: --save "").
    stop_pid "$PIDFILE" 10
    rm -f "$OWNED"
    say "Redis stopped"
  elif port_open "$HOST" "$PORT"; then
    say "Redis at $HOST:$PORT was not started by this script: left running"
  else
    say "Redis at $HOST:$PORT is not running"
  fi
}

status() {
  drop_stale_marker
  if port_open "$HOST" "$PORT"; then
    if [[ -f "$OWNED" ]]; then say "Redis at $HOST:$PORT: up (started by this script, pid $(cat "$PIDFILE"))"
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
