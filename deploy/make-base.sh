#!/usr/bin/env bash
# A base image for deploy/Dockerfile where no image can be pulled: a minimal Debian bookworm
# (Python 3.11 and its venv module) made with debootstrap and loaded with `docker import`.
# Needs root, debootstrap, Docker and a Debian mirror. Usage: sudo deploy/make-base.sh [IMAGE]
# (default dpda-base:bookworm), then DPDA_BASE=dpda-base:bookworm deploy/trial.sh. An image
# already there is kept (DPDA_REBUILD=1 makes it again); DEBIAN_SUITE=trixie makes a Debian 13
# base (Python 3.13) instead.
set -euo pipefail
suite="${DEBIAN_SUITE:-bookworm}"   # trixie: Python 3.13
image="${1:-dpda-base:$suite}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
need() { echo "make-base: $1" >&2; exit 2; }
[ "$(id -u)" = 0 ] || need "debootstrap needs root: run it with sudo"
command -v debootstrap >/dev/null || need "debootstrap is not installed (apt-get install debootstrap)"
command -v docker >/dev/null || need "no docker command: install Docker (apt-get install docker.io)"
docker info >/dev/null 2>&1 || need "no Docker daemon answers: start it (systemctl start docker, or dockerd &)"
if [ "${DPDA_REBUILD:-0}" != 1 ] && docker image inspect "$image" >/dev/null 2>&1; then
  echo "base image: $image (already here)"; exit 0
fi
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv "$suite" "$root" "$mirror" >/dev/null \
  || need "debootstrap failed: is $mirror reachable? (set DEBIAN_MIRROR)"
# what no container reads: package caches, documentation (but each package's copyright),
# manual pages, translations
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
  "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/*
find "$root"/usr/share/doc -type f ! -name copyright -delete
tar -C "$root" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["python3"]' - "$image"
echo "base image: $image"
