#!/usr/bin/env bash
# Kafka and Redis for development and tests, as plain processes on 127.0.0.1.
#
#   deploy/local/infra.sh up | down | status
#
# Addresses come from SWITCHYARD_KAFKA_BOOTSTRAP and SWITCHYARD_REDIS_URL; see kafka.sh
# and redis.sh for reuse of running servers and external hosts.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
case "${1:-}" in
  up)
    "$HERE/kafka.sh" up
    "$HERE/redis.sh" up
    echo "infra.sh: Kafka at ${SWITCHYARD_KAFKA_BOOTSTRAP:-127.0.0.1:9092}, Redis at ${SWITCHYARD_REDIS_URL:-redis://127.0.0.1:6379/0}" >&2
    ;;
  down)
    status=0
    "$HERE/redis.sh" down || status=1
    "$HERE/kafka.sh" down || status=1
    exit $status
    ;;
  status)
    status=0
    "$HERE/kafka.sh" status || status=1
    "$HERE/redis.sh" status || status=1
    exit $status
    ;;
  -h|--help|help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//' ;;
  *) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
