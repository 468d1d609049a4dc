#!/usr/bin/env bash
# A base image for deploy/Dockerfile where no image can be pulled: a minimal Debian bookworm
# (Python 3.11 and its venv module) made with debootstrap and loaded with `docker import`.
# Needs root, debootstrap and a Debian mirror. Usage: sudo deploy/make-base.sh [IMAGE]
# (default dpda-base:bookworm), then DPDA_BASE=dpda-base:bookworm deploy/trial.sh.
set -euo pipefail
image="${1:-dpda-base:bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv bookworm "$root" "$mirror"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["python3"]' - "$image"
echo "base image: $image"
