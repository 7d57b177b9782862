#!/usr/bin/env bash
# A Docker engine, compose v2 and the images docker-compose.yml starts from, for
# `make compose-test`; each step only when it is missing.
#
#   deploy/local/docker.sh [all]   every step below, in order
#   deploy/local/docker.sh engine  install docker.io when dockerd is missing; start dockerd
#                                  (as root, in the background) when no engine answers
#   deploy/local/docker.sh compose the compose v2 CLI plugin, built from the Go module proxy
#                                  when `docker compose version` fails
#   deploy/local/docker.sh images  python:3.11-slim, apache/kafka, redis, the collector,
#                                  Jaeger, HAProxy and Prometheus: pulled; a stand-in is built only when a
#                                  pull fails
#   deploy/local/docker.sh stop    stop the dockerd this script started
#
# A stand-in is built from deploy/docker/standins/ and tagged with the real image's name,
# so the compose file stays as it is; it carries the label org.switchyard.standin, and
# every run tries the real image again first. Caches (the compose plugin and Go's caches,
# the debootstrap base, the dockerd log) live in ${SWITCHYARD_CACHE_DIR:-~/.cache/switchyard}/docker;
# the Kafka jars are deploy/local/kafka.sh's. Each step's time goes to timings.log there.
set -euo pipefail
SCRIPT_NAME=docker.sh
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
# shellcheck source=lib.sh
source "$HERE/lib.sh"

COMPOSE_VERSION=v2.28.1
STANDINS="$ROOT/deploy/docker/standins"
CACHE="$SWITCHYARD_CACHE_DIR/docker"
PIDFILE="$CACHE/dockerd.pid"
DOCKERD_LOG="$CACHE/dockerd.log"
TIMINGS="$CACHE/timings.log"
PULL_TIMEOUT=120
# name of the real image, stand-in folder: the base first, the others are built on it.
IMAGES=(
  "python:3.11-slim base"
  "apache/kafka:3.9.1 kafka"
  "redis:7 redis"
  "otel/opentelemetry-collector-contrib:0.115.0 otel-collector"
  "jaegertracing/all-in-one:1.63.0 jaeger"
  "haproxy:2.6 haproxy"
  "prom/prometheus:v2.42.0 prometheus"
)
# The Docker CLI would otherwise want the buildx plugin, which Debian's docker.io lacks;
# the stand-ins need nothing beyond the classic builder.
export DOCKER_BUILDKIT=0
export DEBIAN_FRONTEND=noninteractive

usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; }

mkdir -p "$CACHE"


# timed NAME COMMAND...: run COMMAND, then record how long it took. COMMAND runs in a
# subshell with errexit on (`cmd || status=$?` would switch errexit off inside it).
timed() {
  local name=$1 start status
  shift
  start=$(date +%s)
  set +e
  (set -e; "$@")
  status=$?
  set -e
  printf '%s %s %ss status=%s\n' "$(date -u +%FT%TZ)" "$name" "$(($(date +%s) - start))" "$status" >>"$TIMINGS"
  say "$name: $(($(date +%s) - start)) s"
  return "$status"
}

engine_answers() { docker info >/dev/null 2>&1; }

# is_process PID NAME: true when PID is a live process whose command name is NAME. A pid
# file outlives its process (a crash, the end of a session), and the kernel may since have
# given the number to another program; kill -0 alone would wait on that program.
is_process() {
  [[ "$1" =~ ^[0-9]+$ ]] && [[ "$(cat "/proc/$1/comm" 2>/dev/null)" == "$2" ]]
}

ours_alive() { [[ -f "$PIDFILE" ]] && is_process "$(cat "$PIDFILE" 2>/dev/null)" dockerd; }

# dockerd refuses to start while its own pid file names a live process, and its containerd
# likewise; a stale file whose number now belongs to another program is removed.
drop_stale_daemon_pidfiles() {
  local file name
  for file in /var/run/docker.pid:dockerd /var/run/docker/containerd/containerd.pid:containerd; do
    name=${file##*:}
    file=${file%:*}
    if [[ -f "$file" ]] && ! is_process "$(cat "$file" 2>/dev/null)" "$name"; then
      rm -f "$file"
    fi
  done
}

start_dockerd() {
  drop_stale_daemon_pidfiles
  say "starting dockerd (log $DOCKERD_LOG)"
  # Detached: its own session, so it outlives this shell and make; containerd and the
  # runtime come with it.
  setsid nohup dockerd >>"$DOCKERD_LOG" 2>&1 </dev/null &
  echo $! >"$PIDFILE"
}

engine() {
  command -v docker >/dev/null || apt_install docker.io
  if engine_answers; then
    say "a Docker engine answers: using it"
    return 0
  fi
  command -v dockerd >/dev/null || apt_install docker.io
  [[ $(id -u) -eq 0 ]] || die "no Docker engine answers and only root can start dockerd; start it (sudo dockerd &) or join the docker group"
  if ours_alive; then
    say "dockerd (pid $(cat "$PIDFILE")) is not answering yet; waiting for it"
    if ! wait_for 60 engine_answers; then
      say "dockerd (pid $(cat "$PIDFILE")) did not answer within 60 s; restarting it"
      stop_pid "$PIDFILE" 30
      start_dockerd
    fi
  else
    rm -f "$PIDFILE"
    start_dockerd
  fi
  # A daemon restarted after an unclean stop first stops the containers it finds still
  # running, up to 20 s each, before it answers.
  if ! wait_for 120 engine_answers; then
    tail -n 30 "$DOCKERD_LOG" >&2 || true
    die "dockerd did not answer within 120 s (log: $DOCKERD_LOG)"
  fi
  say "dockerd is up ($(docker version --format '{{.Server.Version}}' 2>/dev/null), storage driver $(docker info --format '{{.Driver}}'))"
}

stop() {
  if ours_alive; then
    say "stopping dockerd (pid $(cat "$PIDFILE"))"
    stop_pid "$PIDFILE" 30
  else
    say "no dockerd started by this script is running"
    rm -f "$PIDFILE"
  fi
}

compose() {
  if docker compose version >/dev/null 2>&1; then
    say "$(docker compose version)"
    return 0
  fi
  local plugin="$CACHE/cli-plugins/docker-compose"
  if [[ ! -x "$plugin" ]]; then
    command -v go >/dev/null || die "compose v2 is missing and Go (1.21 or later) is needed to build it; install Go or the docker-compose-plugin package"
    say "building the compose $COMPOSE_VERSION CLI plugin from the Go module proxy (once, a few minutes)"
    local log="$CACHE/compose-build.log"
    mkdir -p "$CACHE/go" "$CACHE/cli-plugins"
    if ! GOPATH="$CACHE/go" GOMODCACHE="$CACHE/go/mod" GOCACHE="$CACHE/go/build" \
      GOBIN="$CACHE/go/bin" GOFLAGS=-buildvcs=false CGO_ENABLED=0 \
      go install -ldflags "-s -w -X github.com/docker/compose/v2/internal.Version=$COMPOSE_VERSION" \
      "github.com/docker/compose/v2/cmd@$COMPOSE_VERSION" >"$log" 2>&1 </dev/null; then
      tail -n 30 "$log" >&2 || true
      die "building compose failed (log: $log)"
    fi
    mv "$CACHE/go/bin/cmd" "$plugin"
  fi
  # The CLI looks for plugins in ~/.docker/cli-plugins.
  mkdir -p "$HOME/.docker/cli-plugins"
  ln -sfn "$plugin" "$HOME/.docker/cli-plugins/docker-compose"
  docker compose version >/dev/null 2>&1 || die "docker compose still does not run ($plugin)"
  say "installed $(docker compose version) ($plugin)"
}

label_of() {
  docker image inspect --format "{{ index .Config.Labels \"$2\" }}" "$1" 2>/dev/null || true
}

# A stand-in's recipe: its folder's files, so that a changed recipe is rebuilt.
recipe_hash() {
  (cd "$STANDINS/$1" && find . -type f -print0 | sort -z | xargs -0 sha256sum) | sha256sum | cut -c1-16
}

# ensure_image IMAGE STANDIN: the real image when present or pullable, else the stand-in.
ensure_image() {
  local image=$1 standin=$2 hash current why
  hash=$(recipe_hash "$standin")
  if [[ "$standin" != base ]]; then
    # Built on the base: a new base makes it out of date too.
    hash="$hash-$(docker image inspect --format '{{.Id}}' python:3.11-slim | cut -c8-19)"
  fi
  if docker image inspect "$image" >/dev/null 2>&1 && [[ -z "$(label_of "$image" org.switchyard.standin)" ]]; then
    say "$image: present"
    return 0
  fi
  if timeout "$PULL_TIMEOUT" docker pull -q "$image" >"$CACHE/pull.log" 2>&1 </dev/null; then
    say "$image: pulled"
    return 0
  fi
  why=$(tail -n 1 "$CACHE/pull.log")
  why=${why##*: }
  current=$(label_of "$image" org.switchyard.standin)
  if [[ "$current" == "$hash" ]]; then
    say "$image: cannot be pulled ($why); the stand-in built earlier is current"
    return 0
  fi
  say "$image: cannot be pulled ($why); building a stand-in from deploy/docker/standins/$standin"
  timed "stand-in $image" "build_$(tr - _ <<<"$standin")" "$image" "$hash"
}

# The base: Debian bookworm (minbase) with its Python 3.11, pip and CA certificates,
# imported under python:3.11-slim's tag. The root file system is cached as a tarball.
build_base() {
  local image=$1 hash=$2 tarball="$CACHE/base/bookworm-python-$2.tar"
  if [[ ! -f "$tarball" ]]; then
    command -v debootstrap >/dev/null || apt_install debootstrap
    mkdir -p "$CACHE/base"
    rm -f "$CACHE"/base/bookworm-python-*.tar
    timed "debootstrap base" "$STANDINS/base/rootfs.sh" "$tarball"
  fi
  docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change "LABEL org.switchyard.standin=$hash" \
    --change 'LABEL org.switchyard.standin.for="python:3.11-slim: Debian bookworm minbase with its Python 3.11 and pip"' \
    --change 'CMD ["python3"]' \
    "$tarball" "$image" >/dev/null
}

# build_docker IMAGE HASH FOLDER [CONTEXT]: docker build of a stand-in's Dockerfile.
build_docker() {
  local image=$1 hash=$2 folder=$3 context=${4:-$3}
  local log="$CACHE/standin-build.log"
  if ! docker build --label "org.switchyard.standin=$hash" -t "$image" \
    -f "$folder/Dockerfile" "$context" >"$log" 2>&1 </dev/null; then
    tail -n 30 "$log" >&2
    return 1
  fi
}

build_kafka() {
  "$HERE/kafka.sh" fetch
  local context
  context=$(mktemp -d)
  # The official broker jars that deploy/local uses, next to the stand-in's files.
  cp -r "$STANDINS/kafka/." "$context/"
  cp -r "$SWITCHYARD_CACHE_DIR/kafka-3.9.1/libs" "$context/libs"
  rm -f "$context/libs/.complete"
  build_docker "$1" "$2" "$context" || { rm -rf "$context"; return 1; }
  rm -rf "$context"
}

build_redis() { build_docker "$1" "$2" "$STANDINS/redis"; }
build_otel_collector() { build_docker "$1" "$2" "$STANDINS/otel-collector"; }
build_jaeger() { build_docker "$1" "$2" "$STANDINS/jaeger"; }
build_haproxy() { build_docker "$1" "$2" "$STANDINS/haproxy"; }
build_prometheus() { build_docker "$1" "$2" "$STANDINS/prometheus"; }

images() {
  local entry image standin
  for entry in "${IMAGES[@]}"; do
    read -r image standin <<<"$entry"
    grep -qF "$image" "$ROOT/docker-compose.yml" "$ROOT/deploy/docker/Dockerfile" \
      || die "neither docker-compose.yml nor deploy/docker/Dockerfile names $image any more; update IMAGES in $0"
    ensure_image "$image" "$standin"
  done
}

case "${1:-all}" in
  all)
    timed engine engine
    timed compose compose
    timed images images
    ;;
  engine) engine ;;
  compose) compose ;;
  images) images ;;
  stop) stop ;;
  -h|--help|help) usage ;;
  *) usage >&2; exit 2 ;;
esac
