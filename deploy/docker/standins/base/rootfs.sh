#!/usr/bin/env bash
# Stand-in for python:3.11-slim, used only when that image cannot be pulled: a Debian
# bookworm root file system (debootstrap, minbase) with Debian's Python 3.11, pip and CA
# certificates, written as a tarball for `docker import` (deploy/local/docker.sh).
#
#   deploy/docker/standins/base/rootfs.sh OUT.tar
#
# Differences from the official image: Python is Debian's (/usr/bin/python3, packages
# under /usr/local/lib/python3.11/dist-packages), with `python` and `pip` linked into
# /usr/local/bin; pip may install into the system (the PEP 668 marker is removed: the
# image is the environment, as in the official one). The host's extra CA certificates
# (/usr/local/share/ca-certificates) are trusted in it too, so pip in a build reaches
# PyPI wherever the host's does (a TLS-inspecting proxy, say). Needs root.
set -euo pipefail
SCRIPT_NAME=rootfs.sh
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../../../local/lib.sh
source "$HERE/../../../local/lib.sh"

OUT="${1:-}"
[[ -n "$OUT" ]] || die "usage: $0 OUT.tar"
[[ $(id -u) -eq 0 ]] || die "debootstrap needs root"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

work=$(mktemp -d "${TMPDIR:-/tmp}/switchyard-rootfs.XXXXXX")
trap 'rm -rf "$work"' EXIT
root="$work/root"
say "debootstrap bookworm (minbase) from $MIRROR"
debootstrap --variant=minbase --include=python3,python3-pip,ca-certificates \
  bookworm "$root" "$MIRROR" >"$work/debootstrap.log" 2>&1 \
  || { tail -n 30 "$work/debootstrap.log" >&2; die "debootstrap failed"; }

ln -sf /usr/bin/python3 "$root/usr/local/bin/python"
ln -sf /usr/bin/pip3 "$root/usr/local/bin/pip"
rm -f "$root"/usr/lib/python3.*/EXTERNALLY-MANAGED
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  chroot "$root" update-ca-certificates >/dev/null 2>&1 || die "update-ca-certificates failed in the base"
fi
# pip reads the system bundle, which now holds them, rather than a vendored one.
printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$root/etc/pip.conf"
chroot "$root" apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/log/*.log
tar --numeric-owner -C "$root" -cf "$OUT.tmp" .
mv "$OUT.tmp" "$OUT"
say "wrote $OUT ($(du -h "$OUT" | cut -f1))"
