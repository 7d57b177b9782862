#!/usr/bin/env bash
# A Redis server configured as managed Redis services usually are: TLS only (no plaintext
# port) and an ACL user with a password, the default user switched off. The contract
# tests run the state store's suites against it (tests/contract/conftest.py).
#
#   deploy/local/redis-tls.sh up DIR PORT   make a CA and a server certificate in DIR, start
#                                          redis-server on 127.0.0.1:PORT (TLS), print the
#                                          URL Switchyard takes (SWITCHYARD_REDIS_URL)
#   deploy/local/redis-tls.sh down DIR      stop the server started in DIR
#
# The user `switchyard` may run every command but the dangerous ones (FLUSHALL, KEYS,
# CONFIG, ...) on keys starting with `t` only (the tests' prefixes): least privilege, so a
# test can show a key outside its namespace is refused.
set -euo pipefail
SCRIPT_NAME=redis-tls.sh
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
source "$HERE/lib.sh"

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; }

up() {
  local dir=$1 port=$2 password
  command -v redis-server >/dev/null || die "redis-server is missing (apt-get install redis-server)"
  command -v openssl >/dev/null || die "openssl is missing (apt-get install openssl)"
  mkdir -p "$dir"
  test_certificates "$dir" || die "openssl could not make the certificates in $dir"
  password=$(openssl rand -hex 24)
  printf 'user default off\nuser switchyard on >%s ~t* &* +@all -@dangerous\n' "$password" \
    >"$dir/users.acl"
  chmod 600 "$dir/users.acl" "$dir"/*.key
  if ! redis-server --port 0 --tls-port "$port" --bind 127.0.0.1 \
    --tls-cert-file "$dir/server.crt" --tls-key-file "$dir/server.key" \
    --tls-ca-cert-file "$dir/ca.crt" --tls-auth-clients no \
    --aclfile "$dir/users.acl" --daemonize yes --pidfile "$dir/redis.pid" \
    --dir "$dir" --logfile "$dir/redis.log" --save "" --appendonly no </dev/null >/dev/null 2>&1; then
    tail -n 20 "$dir/redis.log" >&2 || true
    die "redis-server refused to start with TLS"
  fi
  wait_for 20 port_open 127.0.0.1 "$port" || die "Redis (TLS) did not listen on $port within 20 s"
  say "Redis with TLS and ACL user switchyard at 127.0.0.1:$port (log $dir/redis.log)"
  printf 'rediss://switchyard:%s@127.0.0.1:%s/0?ssl_ca_certs=%s&ssl_cert_reqs=required\n' \
    "$password" "$port" "$dir/ca.crt"
}

down() {
  local dir=$1
  if [[ -f "$dir/redis.pid" ]]; then
    stop_pid "$dir/redis.pid" 10
    say "Redis (TLS) in $dir stopped"
  fi
}

case "${1:-}" in
  up) [[ $# -eq 3 ]] || { usage >&2; exit 2; }; up "$2" "$3" ;;
  down) [[ $# -eq 2 ]] || { usage >&2; exit 2; }; down "$2" ;;
  -h|--help) usage ;;
  *) usage >&2; exit 2 ;;
esac
