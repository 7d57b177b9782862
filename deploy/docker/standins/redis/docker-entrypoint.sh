#!/usr/bin/env bash
# Debian builds Redis with protected mode on; the official image turns it off (containers
# reach it over their network, not loopback). The option goes right after the server's
# configuration file, when one is given, so that later arguments still override it.
set -euo pipefail
if [[ "${1:-}" == -* || "${1:-}" == *.conf ]]; then
  set -- redis-server "$@"
fi
if [[ "${1:-}" == redis-server ]]; then
  shift
  if [[ "${1:-}" == *.conf ]]; then
    config=$1
    shift
    set -- "$config" --protected-mode no "$@"
  else
    set -- --protected-mode no "$@"
  fi
  exec redis-server "$@"
fi
exec "$@"
