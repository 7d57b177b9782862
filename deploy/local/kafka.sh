#!/usr/bin/env bash
# A single-node Apache Kafka broker (KRaft mode) from the official jars, without Docker.
#
#   deploy/local/kafka.sh fetch    download the broker jars once (Maven Central, cached)
#   deploy/local/kafka.sh up       start it on SWITCHYARD_KAFKA_BOOTSTRAP (127.0.0.1:9092)
#   deploy/local/kafka.sh down     stop it, if this script started it
#   deploy/local/kafka.sh status   say whether a broker answers
#   deploy/local/kafka.sh reset    stop it and wipe its storage
#   deploy/local/kafka.sh logs     the last lines of the broker log
#
# A broker already answering on the address is reused and left running by `down`. When
# SWITCHYARD_KAFKA_BOOTSTRAP names another host, nothing is started: `up` only checks it.
set -euo pipefail
SCRIPT_NAME=kafka.sh
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
source "$HERE/lib.sh"

KAFKA_VERSION=3.9.1
BOOTSTRAP="${SWITCHYARD_KAFKA_BOOTSTRAP:-127.0.0.1:9092}"
FIRST="${BOOTSTRAP%%,*}"
HOST="${FIRST%:*}"
PORT="${FIRST##*:}"
CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-$((PORT + 1))}"
LIBS="$SWITCHYARD_CACHE_DIR/kafka-$KAFKA_VERSION/libs"
RUN="$SWITCHYARD_CACHE_DIR/run/kafka-$PORT"
PIDFILE="$RUN/kafka.pid"
OWNED="$RUN/owned"
LOG="$RUN/kafka.log"

usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; }

fetch() {
  if [[ -f "$LIBS/.complete" ]]; then
    return 0
  fi
  command -v mvn >/dev/null || die "Maven (mvn) is needed to fetch the Kafka jars; install it (apt-get install maven)"
  say "fetching Apache Kafka $KAFKA_VERSION broker jars into $LIBS (once)"
  rm -rf "$LIBS"
  mkdir -p "$LIBS"
  mvn -q -B -Dstyle.color=never -f "$HERE/kafka/pom.xml" dependency:copy-dependencies -DoutputDirectory="$LIBS" \
    || die "could not fetch the Kafka jars with Maven"
  [[ -f "$LIBS/kafka_2.13-$KAFKA_VERSION.jar" ]] || die "Maven finished but kafka_2.13-$KAFKA_VERSION.jar is missing"
  touch "$LIBS/.complete"
}

java_cmd() {
  command -v java >/dev/null || die "Java 17 is needed to run the Kafka broker; install it (apt-get install openjdk-17-jre-headless)"
  java -cp "$LIBS/*" -Dlog4j.configuration="file:$HERE/kafka/log4j.properties" "$@"
}

kafka_ready() { port_open "$HOST" "$PORT" && grep -q "Kafka Server started" "$LOG" 2>/dev/null; }

up() {
  if ! is_local_host "$HOST"; then
    port_open "$HOST" "$PORT" || die "Kafka at $BOOTSTRAP does not answer (not local: nothing to start)"
    say "Kafka at $BOOTSTRAP answers (external, left alone)"
    return 0
  fi
  if port_open "$HOST" "$PORT"; then
    if [[ -f "$OWNED" ]]; then say "Kafka at $BOOTSTRAP already running (started by this script)"
    else say "Kafka at $BOOTSTRAP already answers: reusing it"; fi
    return 0
  fi
  fetch
  mkdir -p "$RUN/data"
  sed -e "s|@PORT@|$PORT|g" -e "s|@CONTROLLER_PORT@|$CONTROLLER_PORT|g" -e "s|@DATA_DIR@|$RUN/data|g" \
    "$HERE/kafka/server.properties.in" >"$RUN/server.properties"
  if [[ ! -f "$RUN/data/meta.properties" ]]; then
    local cluster_id
    cluster_id=$(java_cmd kafka.tools.StorageTool random-uuid)
    java_cmd kafka.tools.StorageTool format -t "$cluster_id" -c "$RUN/server.properties" >/dev/null \
      || die "formatting Kafka storage in $RUN/data failed"
  fi
  : >"$LOG"
  say "starting Kafka $KAFKA_VERSION (KRaft) on $HOST:$PORT, controller on $CONTROLLER_PORT"
  setsid nohup java -Xms256m -Xmx768m -XX:+UseG1GC -Djava.awt.headless=true \
    -cp "$LIBS/*" -Dlog4j.configuration="file:$HERE/kafka/log4j.properties" \
    kafka.Kafka "$RUN/server.properties" >>"$LOG" 2>&1 </dev/null &
  echo $! >"$PIDFILE"
  touch "$OWNED"
  if ! wait_for 90 kafka_ready; then
    say "Kafka did not start within 90 s; last lines of $LOG:"
    tail -n 30 "$LOG" >&2 || true
    stop_pid "$PIDFILE" 5
    rm -f "$OWNED"
    exit 1
  fi
  say "Kafka is up at $HOST:$PORT (log: $LOG)"
}

down() {
  if [[ -f "$OWNED" ]]; then
    say "stopping Kafka on $HOST:$PORT"
    stop_pid "$PIDFILE" 30
    rm -f "$OWNED"
  elif port_open "$HOST" "$PORT"; then
    say "Kafka at $BOOTSTRAP was not started by this script: left running"
  fi
}

status() {
  if port_open "$HOST" "$PORT"; then
    if [[ -f "$OWNED" ]]; then say "Kafka at $BOOTSTRAP: up (started by this script, pid $(cat "$PIDFILE" 2>/dev/null))"
    else say "Kafka at $BOOTSTRAP: up (not started by this script)"; fi
  else
    say "Kafka at $BOOTSTRAP: down"
    return 1
  fi
}

case "${1:-}" in
  fetch) fetch ;;
  up) up ;;
  down) down ;;
  status) status ;;
  reset) down; rm -rf "$RUN"; say "wiped $RUN" ;;
  logs) tail -n "${2:-50}" "$LOG" ;;
  -h|--help|help) usage ;;
  *) usage >&2; exit 2 ;;
esac
