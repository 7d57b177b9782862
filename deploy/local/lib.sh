# Shared helpers for the deploy/local scripts. Sourced, not run.

SWITCHYARD_CACHE_DIR="${SWITCHYARD_CACHE_DIR:-$HOME/.cache/switchyard}"

say() { printf '%s: %s\n' "$SCRIPT_NAME" "$*" >&2; }
die() { say "$*"; exit 1; }

is_local_host() {
  case "$1" in
    127.*|localhost|::1|"[::1]") return 0 ;;
    *) return 1 ;;
  esac
}

# port_open HOST PORT: true when something accepts TCP connections there.
port_open() {
  (exec 3<>"/dev/tcp/$1/$2") >/dev/null 2>&1
}

# wait_for SECONDS COMMAND...: run COMMAND every 0.2 s until it succeeds or time runs out.
wait_for() {
  local seconds=$1; shift
  local tries=$((seconds * 5))
  while ((tries-- > 0)); do
    "$@" && return 0
    sleep 0.2
  done
  return 1
}

pid_gone() { ! kill -0 "$1" 2>/dev/null; }

# stop_pid PIDFILE SECONDS: SIGTERM, wait, then SIGKILL.
stop_pid() {
  local pidfile=$1 seconds=$2 pid
  [[ -f "$pidfile" ]] || return 0
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    if ! wait_for "$seconds" pid_gone "$pid"; then
      say "pid $pid did not stop in ${seconds}s; killing it"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$pidfile"
}

# apt_install PACKAGE...: install Debian packages (as root; apt-get update once a run).
apt_updated=0
apt_install() {
  if [[ $(id -u) -ne 0 ]]; then
    die "missing Debian packages: $*; install them as root (sudo apt-get install $*), then run this again"
  fi
  command -v apt-get >/dev/null || die "missing packages: $*; this script installs them only on Debian/Ubuntu (apt-get)"
  if ((apt_updated == 0)); then
    say "apt-get update"
    apt-get update -qq </dev/null >/dev/null
    apt_updated=1
  fi
  say "installing Debian packages: $*"
  apt-get install -y -qq --no-install-recommends "$@" </dev/null >/dev/null
}

# test_certificates DIR: a CA (ca.crt, ca.key) and a server certificate for 127.0.0.1 and
# localhost signed by it (server.crt, server.key) in DIR, valid two days: for the TLS
# servers the tests start (redis-tls.sh, kafka-secure.sh).
test_certificates() {
  local dir=$1
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=switchyard test CA" \
    -keyout "$dir/ca.key" -out "$dir/ca.crt" >/dev/null 2>&1 || return 1
  openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" \
    -keyout "$dir/server.key" -out "$dir/server.csr" >/dev/null 2>&1 || return 1
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$dir/san.ext"
  openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
    -CAcreateserial -days 2 -extfile "$dir/san.ext" -out "$dir/server.crt" >/dev/null 2>&1
}
