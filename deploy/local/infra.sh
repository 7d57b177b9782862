#!/usr/bin/env bash
# Kafka and Redis for development and tests, as plain processes on 127.0.0.1.
#
#   deploy/local/infra.sh up [--record FILE]     start both (or reuse running ones)
#   deploy/local/infra.sh down [--started FILE]  stop what these scripts started
#   deploy/local/infra.sh status
#
# Addresses come from SWITCHYARD_KAFKA_BOOTSTRAP and SWITCHYARD_REDIS_URL; see kafka.sh
# and redis.sh for reuse of running servers and external hosts. `up --record FILE` writes
# the names of the servers this very call started to FILE, and `down --started FILE`
# stops only those: `make test` uses the pair so that it never stops a broker that was
# already running before it (started by `make infra-up`, say).
set -euo pipefail
SCRIPT_NAME=infra.sh
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
source "$HERE/lib.sh"

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }

command="${1:-}"
[[ $# -gt 0 ]] && shift
file=""
case "$command:${1:-}" in
  up:--record|down:--started)
    [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a file name"
    file="$2"
    ;;
  *:) ;;
  *:-h|*:--help) usage; exit 0 ;;
  *) usage >&2; exit 2 ;;
esac

case "$command" in
  up)
    if [[ -n "$file" ]]; then
      : >>"$file"
      export SWITCHYARD_INFRA_RECORD="$file"
    fi
    "$HERE/kafka.sh" up
    "$HERE/redis.sh" up
    say "Kafka at ${SWITCHYARD_KAFKA_BOOTSTRAP:-127.0.0.1:9092}, Redis at ${SWITCHYARD_REDIS_URL:-redis://127.0.0.1:6379/0}"
    ;;
  down)
    status=0
    if [[ -z "$file" ]] || grep -qx redis "$file" 2>/dev/null; then
      "$HERE/redis.sh" down || status=1
    fi
    if [[ -z "$file" ]] || grep -qx kafka "$file" 2>/dev/null; then
      "$HERE/kafka.sh" down || status=1
    fi
    if [[ -n "$file" && ! -s "$file" ]]; then
      say "nothing was started by this run: Kafka and Redis left as they were"
    fi
    exit "$status"
    ;;
  status)
    status=0
    "$HERE/kafka.sh" status || status=1
    "$HERE/redis.sh" status || status=1
    exit "$status"
    ;;
  -h|--help|help) usage ;;
  *) usage >&2; exit 2 ;;
esac
