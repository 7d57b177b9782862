#!/usr/bin/env bash
# Helm, and KEDA's ScaledObject schema, for rendering and checking deploy/helm/switchyard.
#
#   deploy/local/helm.sh [install]  make both available (once), print helm's path
#   deploy/local/helm.sh path       print helm's path; fail when there is none (no build)
#   deploy/local/helm.sh crd        print the path of KEDA's ScaledObject CRD; fail when
#                                   it was not downloaded (no download)
#
# A `helm` on PATH is used as it is. Otherwise helm is built once with the Go toolchain
# from the Go module proxy into ${SWITCHYARD_CACHE_DIR:-~/.cache/switchyard}/bin, and
# rebuilt only when HELM_VERSION changes. KEDA's CRD is read from KEDA's Go module,
# downloaded once into the same cache. Go's module and build caches live there too,
# never in the repository.
set -euo pipefail
SCRIPT_NAME=helm.sh
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib.sh
source "$HERE/lib.sh"

HELM_VERSION=v3.22.0
KEDA_VERSION=v2.21.0
KEDA_MODULE=github.com/kedacore/keda/v2
BIN="$SWITCHYARD_CACHE_DIR/bin"
CACHED_HELM="$BIN/helm"
GO_HOME="$SWITCHYARD_CACHE_DIR/go"
# The CRD's path, recorded once the module is downloaded (its directory is Go's business).
CRD_RECORD="$SWITCHYARD_CACHE_DIR/keda-$KEDA_VERSION.crd-path"

usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; }

# Go with every cache under $GO_HOME; -modcacherw so that `rm -rf` can clear it.
go_cached() {
  mkdir -p "$GO_HOME"
  (cd "$GO_HOME" && GOPATH="$GO_HOME" GOMODCACHE="$GO_HOME/mod" GOCACHE="$GO_HOME/build" \
    GOFLAGS="-modcacherw" GO111MODULE=on "$@")
}

need_go() {
  command -v go >/dev/null \
    || die "helm is not on PATH and Go is needed to build it; install Go 1.24 or later (or helm itself)"
}

# The helm to use: one on PATH, else ours when it is the pinned version; empty when none.
find_helm() {
  if command -v helm >/dev/null; then
    command -v helm
  elif [[ -x "$CACHED_HELM" ]] \
    && [[ "$("$CACHED_HELM" version --template '{{.Version}}' 2>/dev/null)" == "$HELM_VERSION" ]]; then
    echo "$CACHED_HELM"
  fi
}

# Module directory of MODULE@VERSION, downloaded into Go's module cache when missing.
module_dir() {
  go_cached go mod download -json "$1" </dev/null \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p'
}

build_helm() {
  need_go
  say "building helm $HELM_VERSION with $(go version | cut -d' ' -f3) into $BIN (once; a few minutes)"
  local log="$SWITCHYARD_CACHE_DIR/helm-build.log" dir client_go major minor
  mkdir -p "$BIN"
  dir=$(module_dir "helm.sh/helm/v3@$HELM_VERSION") && [[ -f "$dir/go.mod" ]] \
    || die "could not download helm.sh/helm/v3@$HELM_VERSION from the Go module proxy"
  # What helm's Makefile stamps in: its version, and the Kubernetes version of its
  # client-go (v0.N.x is Kubernetes 1.N), which `helm template` and `helm lint` assume.
  # Without it they would assume Kubernetes 1.20.
  client_go=$(awk '$1 == "k8s.io/client-go" { print $2 }' "$dir/go.mod")
  [[ "$client_go" =~ ^v0\.([0-9]+)\. ]] || die "cannot read helm's k8s.io/client-go version from $dir/go.mod"
  major=1 minor="${BASH_REMATCH[1]}"
  local ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  local pkg
  for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    ldflags+=" -X $pkg.k8sVersionMajor=$major -X $pkg.k8sVersionMinor=$minor"
  done
  # Static, so the binary does not depend on the C library it was built against.
  if ! go_cached env GOBIN="$BIN" CGO_ENABLED=0 \
    go install -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >"$log" 2>&1 </dev/null; then
    tail -n 30 "$log" >&2 || true
    die "building helm $HELM_VERSION failed (log: $log)"
  fi
}

fetch_crd() {
  local crd
  if [[ -f "$CRD_RECORD" ]] && crd=$(cat "$CRD_RECORD") && [[ -f "$crd" ]]; then
    return 0
  fi
  need_go
  say "downloading KEDA $KEDA_VERSION's Go module for its ScaledObject CRD (once)"
  local dir
  dir=$(module_dir "$KEDA_MODULE@$KEDA_VERSION") \
    || die "could not download $KEDA_MODULE@$KEDA_VERSION from the Go module proxy"
  crd="$dir/config/crd/bases/keda.sh_scaledobjects.yaml"
  [[ -n "$dir" && -f "$crd" ]] || die "KEDA's module has no ScaledObject CRD at $crd"
  echo "$crd" >"$CRD_RECORD"
}

install() {
  local helm
  helm=$(find_helm)
  if [[ -z "$helm" ]]; then
    build_helm
    helm=$(find_helm)
    [[ -n "$helm" ]] || die "helm was built but $CACHED_HELM does not report $HELM_VERSION"
  fi
  fetch_crd
  echo "$helm"
}

path() {
  local helm
  helm=$(find_helm)
  [[ -n "$helm" ]] || die "no helm: not on PATH and not built into $BIN; run deploy/local/helm.sh (or make deps)"
  echo "$helm"
}

crd() {
  [[ -f "$CRD_RECORD" ]] && [[ -f "$(cat "$CRD_RECORD")" ]] \
    || die "KEDA's ScaledObject CRD was not downloaded; run deploy/local/helm.sh (or make deps)"
  cat "$CRD_RECORD"
}

case "${1:-install}" in
  install) install ;;
  path) path ;;
  crd) crd ;;
  -h|--help|help) usage ;;
  *) usage >&2; exit 2 ;;
esac
