#!/usr/bin/env bash
# Installs what a fresh development or CI machine lacks, and nothing when all is there:
# Debian's redis-server, the virtual environment .venv with Switchyard and its
# development dependencies, and the Kafka broker jars (cached in ~/.cache/switchyard).
# Pip's and Maven's download caches stay outside the repository.
#
#   deploy/local/bootstrap.sh [--extras dev,ml]
set -euo pipefail
SCRIPT_NAME=bootstrap.sh
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
# shellcheck source=lib.sh
source "$HERE/lib.sh"

EXTRAS=dev
while (($#)); do
  case "$1" in
    --extras) EXTRAS="$2"; shift 2 ;;
    -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1" ;;
  esac
done

apt_updated=0
apt_install() {
  if [[ $(id -u) -ne 0 ]]; then
    die "missing Debian packages: $*; install them as root (apt-get install $*)"
  fi
  if ((apt_updated == 0)); then
    say "apt-get update"
    apt-get update -qq >/dev/null
    apt_updated=1
  fi
  say "installing Debian packages: $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

command -v redis-server >/dev/null || apt_install redis-server
command -v java >/dev/null || apt_install openjdk-17-jre-headless
command -v mvn >/dev/null || apt_install maven

PYTHON=""
for candidate in python3.11 python3; do
  if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    PYTHON="$candidate"
    break
  fi
done
[[ -n "$PYTHON" ]] || die "Python 3.11 is needed (python3.11 not found)"

VENV="$ROOT/.venv"
if [[ ! -x "$VENV/bin/python" ]]; then
  say "creating $VENV with $PYTHON"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
fi
stamp="$VENV/.installed-$(cat "$ROOT/pyproject.toml" <(echo "$EXTRAS") | sha256sum | cut -c1-16)"
if [[ ! -f "$stamp" ]]; then
  say "installing Switchyard[$EXTRAS] into $VENV"
  "$VENV/bin/python" -m pip install -q -e "$ROOT[$EXTRAS]"
  rm -f "$VENV"/.installed-*
  touch "$stamp"
fi

"$HERE/kafka.sh" fetch
