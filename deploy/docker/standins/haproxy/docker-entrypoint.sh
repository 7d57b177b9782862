#!/usr/bin/env bash
# As the official image's: options alone run haproxy with them, and haproxy runs in the
# master-worker mode (-W) in the foreground, logging to stderr (-db).
set -euo pipefail
if [[ "${1:-}" == -* ]]; then
  set -- haproxy "$@"
fi
if [[ "${1:-}" == haproxy ]]; then
  shift
  set -- haproxy -W -db "$@"
fi
exec "$@"
