#!/usr/bin/env bash
# Installs what a fresh development or CI machine lacks, and nothing when all is there:
# Debian's redis-server and prometheus (and Java 17 / Maven when missing), the virtual environment .venv
# with Switchyard and its development dependencies, and the Kafka broker jars (cached in
# ${SWITCHYARD_CACHE_DIR:-~/.cache/switchyard}). Pip's and Maven's download caches stay
# outside the repository. `pip install` runs again only when pyproject.toml changes.
#
#   deploy/local/bootstrap.sh [--extras dev[,ml][,report]]
set -euo pipefail
SCRIPT_NAME=bootstrap.sh
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
# shellcheck source=lib.sh
source "$HERE/lib.sh"

usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; }

EXTRAS=dev,ml,report
while (($#)); do
  case "$1" in
    --extras) [[ $# -ge 2 ]] || die "--extras needs a value"; EXTRAS="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument $1" ;;
  esac
done

export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1


# System packages, each only when its command is missing.
command -v redis-server >/dev/null || apt_install redis-server
command -v openssl >/dev/null || apt_install openssl  # the TLS Redis of the contract tests
# Prometheus and promtool: the dashboard's and the alerting rules' test (tests/integration/test_dashboard.py).
command -v prometheus >/dev/null || apt_install prometheus
command -v java >/dev/null || apt_install openjdk-17-jre-headless
command -v mvn >/dev/null || apt_install maven
command -v gcc >/dev/null || apt_install gcc  # mypyc compiles the simulator's hot modules
command -v java >/dev/null || die "java is still missing after the install; Java 17 is needed for the Kafka broker"
command -v mvn >/dev/null || die "mvn is still missing after the install; Maven fetches the Kafka broker jars"

# Python 3.11 for the virtual environment.
is_311() { "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; }
PYTHON=""
for candidate in python3.11 python3; do
  if command -v "$candidate" >/dev/null && is_311 "$candidate"; then
    PYTHON="$candidate"
    break
  fi
done
[[ -n "$PYTHON" ]] || die "Python 3.11 is needed (neither python3.11 nor python3 is 3.11); install python3.11"

VENV="$ROOT/.venv"
if [[ -e "$VENV" ]] && ! { [[ -x "$VENV/bin/python" ]] && is_311 "$VENV/bin/python" && [[ -x "$VENV/bin/pip" ]]; }; then
  say "$VENV is broken or not Python 3.11: recreating it"
  rm -rf "$VENV"
fi
if [[ ! -e "$VENV" ]]; then
  if ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null; then
    # Debian splits venv out of the interpreter package.
    apt_install "python3.11-venv"
  fi
  say "creating $VENV with $(command -v "$PYTHON")"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip </dev/null
fi

# Reinstall only when pyproject.toml, the pinned numerical stack (constraints.txt) or the
# extras asked for changed since the last install.
stamp="$VENV/.installed-$(cat "$ROOT/pyproject.toml" "$HERE/constraints.txt" | sha256sum | cut -d' ' -f1)"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$EXTRAS" ]]; then
  say "installing switchyard[$EXTRAS] (editable) into $VENV"
  "$VENV/bin/python" -m pip install -q -c "$HERE/constraints.txt" -e "$ROOT[$EXTRAS]" </dev/null
  rm -f "$VENV"/.installed-*
  printf '%s' "$EXTRAS" >"$stamp"
fi

# The Kafka broker jars, so that the first `make test` has everything before tests start.
"$HERE/kafka.sh" fetch
"$HERE/helm.sh" >/dev/null  # helm and KEDA's ScaledObject CRD, for tests/unit/test_helm_chart.py
say "ready (.venv with switchyard[$EXTRAS], redis-server, prometheus, java, Kafka jars)"
