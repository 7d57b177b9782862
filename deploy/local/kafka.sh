#!/usr/bin/env bash
# A single-node Apache Kafka broker (KRaft mode) from the official jars, without Docker.
#
#   deploy/local/kafka.sh fetch    download the broker jars once (Maven Central, cached)
#   deploy/local/kafka.sh up       start it on SWITCHYARD_KAFKA_BOOTSTRAP (127.0.0.1:9092)
#   deploy/local/kafka.sh down     stop it, if this script started it
#   deploy/local/kafka.sh status   say whether a broker answers
#   deploy/local/kafka.sh reset    stop it and wipe its storage
#   deploy/local/kafka.sh logs [N] the last N (50) lines of the broker log
#
# A broker already answering on the address is reused and left running by `down`. When
# SWITCHYARD_KAFKA_BOOTSTRAP names another host, nothing is started: `up` only checks it.
# When `up` starts the broker and SWITCHYARD_INFRA_RECORD names a file, it appends "kafka".
# Jars and run directories live in ${SWITCHYARD_CACHE_DIR:-~/.cache/switchyard}.
set -euo pipefail
SCRIPT_NAME=kafka.sh
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
source "$HERE/lib.sh"

KAFKA_VERSION=3.9.1
BOOTSTRAP="${SWITCHYARD_KAFKA_BOOTSTRAP:-127.0.0.1:9092}"
FIRST="${BOOTSTRAP%%,*}"
FIRST="${FIRST#*://}"
HOST="${FIRST%:*}"
PORT="${FIRST##*:}"
[[ "$PORT" =~ ^[0-9]+$ && "$HOST" != "$FIRST" ]] || die "cannot read host:port from SWITCHYARD_KAFKA_BOOTSTRAP=$BOOTSTRAP"
CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-$((PORT + 1))}"
LIBS="$SWITCHYARD_CACHE_DIR/kafka-$KAFKA_VERSION/libs"
RUN="$SWITCHYARD_CACHE_DIR/run/kafka-$PORT"
PIDFILE="$RUN/kafka.pid"
OWNED="$RUN/owned"
LOG="$RUN/kafka.log"
START_TIMEOUT=60
STOP_TIMEOUT=20

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; }

need_java() {
  command -v java >/dev/null \
    || die "Java 17 is needed to run the Kafka broker; install it (apt-get install openjdk-17-jre-headless) or run deploy/local/bootstrap.sh"
}

fetch() {
  if [[ -f "$LIBS/.complete" ]]; then
    return 0
  fi
  command -v mvn >/dev/null || die "Maven (mvn) is needed to fetch the Kafka jars; install it (apt-get install maven) or run deploy/local/bootstrap.sh"
  say "fetching Apache Kafka $KAFKA_VERSION broker jars into $LIBS (once)"
  rm -rf "$LIBS"
  mkdir -p "$LIBS"
  local fetch_log="$SWITCHYARD_CACHE_DIR/kafka-fetch.log"
  if ! mvn -q -B -Dstyle.color=never -f "$HERE/kafka/pom.xml" \
    dependency:copy-dependencies -DoutputDirectory="$LIBS" >"$fetch_log" 2>&1 </dev/null; then
    tail -n 30 "$fetch_log" >&2 || true
    die "could not fetch the Kafka jars with Maven (log: $fetch_log)"
  fi
  [[ -f "$LIBS/kafka_2.13-$KAFKA_VERSION.jar" ]] || die "Maven finished but kafka_2.13-$KAFKA_VERSION.jar is missing from $LIBS"
  touch "$LIBS/.complete"
}

kafka_java() {
  java -cp "$LIBS/*" -Dlog4j.configuration="file:$HERE/kafka/log4j.properties" "$@"
}

# True when the pid file names a live broker process running this run directory's config.
# Guards against a stale marker (a crash, a reboot) and a pid reused by another program.
ours_alive() {
  local pid
  [[ -f "$PIDFILE" ]] || return 1
  pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "kafka.Kafka $RUN/server.properties"
}

# Forgets a marker whose broker is gone.
drop_stale_marker() {
  if [[ -f "$OWNED" ]] && ! ours_alive; then
    rm -f "$OWNED" "$PIDFILE"
  fi
}

# reachable HOST PORT: port_open with a time limit (a remote host may drop packets).
reachable() { timeout 5 bash -c '(exec 3<>"/dev/tcp/$0/$1")' "$1" "$2" >/dev/null 2>&1; }

kafka_ready() { port_open "$HOST" "$PORT" && grep -q "Kafka Server started" "$LOG" 2>/dev/null; }

# Waits until the broker answers and has logged its start; gives up early if it died.
wait_ready() {
  local tries=$((START_TIMEOUT * 5))
  while ((tries-- > 0)); do
    kafka_ready && return 0
    kill -0 "$(cat "$PIDFILE")" 2>/dev/null || { say "the broker process exited during start-up"; return 1; }
    sleep 0.2
  done
  say "Kafka did not start within ${START_TIMEOUT}s"
  return 1
}

up() {
  if ! is_local_host "$HOST"; then
    reachable "$HOST" "$PORT" || die "Kafka at $BOOTSTRAP does not answer (not a local address: nothing to start)"
    say "Kafka at $BOOTSTRAP answers (external, left alone)"
    return 0
  fi
  drop_stale_marker
  if port_open "$HOST" "$PORT"; then
    if [[ -f "$OWNED" ]]; then say "Kafka at $HOST:$PORT already running (started earlier by this script, pid $(cat "$PIDFILE"))"
    else say "Kafka at $HOST:$PORT already answers: reusing it"; fi
    return 0
  fi
  if ours_alive; then
    # Our broker process exists but does not answer: still starting, or wedged.
    say "a broker started by this script (pid $(cat "$PIDFILE")) is not answering; waiting for it"
    touch "$OWNED"
  else
    need_java
    fetch
    if port_open 127.0.0.1 "$CONTROLLER_PORT"; then
      die "controller port $CONTROLLER_PORT is taken by another program; set KAFKA_CONTROLLER_PORT"
    fi
    mkdir -p "$RUN/data"
    sed -e "s|@PORT@|$PORT|g" -e "s|@CONTROLLER_PORT@|$CONTROLLER_PORT|g" -e "s|@DATA_DIR@|$RUN/data|g" \
      "$HERE/kafka/server.properties.in" >"$RUN/server.properties"
    if [[ ! -f "$RUN/data/meta.properties" ]]; then
      local cluster_id
      cluster_id=$(kafka_java kafka.tools.StorageTool random-uuid 2>>"$RUN/format.log") \
        || die "could not make a cluster id (log: $RUN/format.log)"
      kafka_java kafka.tools.StorageTool format -t "$cluster_id" -c "$RUN/server.properties" \
        >>"$RUN/format.log" 2>&1 || { tail -n 30 "$RUN/format.log" >&2; die "formatting Kafka storage in $RUN/data failed"; }
      say "formatted Kafka storage in $RUN/data (cluster $cluster_id)"
    fi
    : >"$LOG"
    say "starting Kafka $KAFKA_VERSION (KRaft) on $HOST:$PORT, controller on 127.0.0.1:$CONTROLLER_PORT"
    # Detached: its own session, no terminal, so it outlives this shell and make.
    setsid nohup java -Xms256m -Xmx512m -XX:+UseG1GC -Djava.awt.headless=true \
      -cp "$LIBS/*" -Dlog4j.configuration="file:$HERE/kafka/log4j.properties" \
      kafka.Kafka "$RUN/server.properties" >>"$LOG" 2>&1 </dev/null &
    echo $! >"$PIDFILE"
    touch "$OWNED"
  fi
  if ! wait_ready; then
    say "last lines of $LOG:"
    tail -n 30 "$LOG" >&2 || true
    stop_pid "$PIDFILE" 5
    rm -f "$OWNED"
    exit 1
  fi
  if [[ -n "${SWITCHYARD_INFRA_RECORD:-}" ]]; then echo kafka >>"$SWITCHYARD_INFRA_RECORD"; fi
  say "Kafka is up at $HOST:$PORT (pid $(cat "$PIDFILE"), log $LOG)"
}

down() {
  is_local_host "$HOST" || { say "Kafka at $BOOTSTRAP is external: left alone"; return 0; }
  drop_stale_marker
  if [[ -f "$OWNED" ]]; then
    say "stopping Kafka on $HOST:$PORT (pid $(cat "$PIDFILE"))"
    stop_pid "$PIDFILE" "$STOP_TIMEOUT"
    rm -f "$OWNED"
    say "Kafka stopped"
  elif port_open "$HOST" "$PORT"; then
    say "Kafka at $HOST:$PORT was not started by this script: left running"
  else
    say "Kafka at $HOST:$PORT is not running"
  fi
}

status() {
  drop_stale_marker
  if port_open "$HOST" "$PORT"; then
    if [[ -f "$OWNED" ]]; then say "Kafka at $HOST:$PORT: up (started by this script, pid $(cat "$PIDFILE"), log $LOG)"
    else say "Kafka at $HOST:$PORT: up (not started by this script)"; fi
  else
    say "Kafka at $HOST:$PORT: down"
    return 1
  fi
}

reset() {
  is_local_host "$HOST" || die "Kafka at $BOOTSTRAP is external: nothing to reset"
  down
  rm -rf "$RUN"
  say "wiped $RUN"
}

logs() {
  [[ -f "$LOG" ]] || die "no broker log at $LOG"
  tail -n "${1:-50}" "$LOG"
}

case "${1:-}" in
  fetch) fetch ;;
  up) up ;;
  down) down ;;
  status) status ;;
  reset) reset ;;
  logs) logs "${2:-50}" ;;
  -h|--help|help) usage ;;
  *) usage >&2; exit 2 ;;
esac
