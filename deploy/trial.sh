#!/usr/bin/env bash
# The container trial, end to end, from a fresh checkout: wheels, the image, keys for both
# parties, configs with the real fingerprints, one job through `compose up`, and
# `dpda ledger verify` / `dpda audit verify` on both parties' volumes.
#
#   deploy/trial.sh [TRIAL_DIR]
#
# TRIAL_DIR (default: a new folder under $TMPDIR) holds the keys and the configs; it must be
# outside the checkout. Environment:
#   DPDA_BASE   the base image (default: the Dockerfile's, the official slim Python image;
#               where no image can be pulled, deploy/make-base.sh builds dpda-base:bookworm)
#   PYTHON      the Python 3.11 that builds the wheels (default: .venv/bin/python, else python3)
#   DPDA_KEEP=1 leave the containers and volumes in place afterwards
# Needs Docker and Compose (`docker compose` or `docker-compose`), and a package index for
# `pip wheel`. The data is the public synthetic problem the source generates at start.
set -euo pipefail
cd "$(dirname "$0")/.."
checkout="$(pwd -P)"
start=$SECONDS
step() { printf '\n== %s (%ds)\n' "$1" "$((SECONDS - start))"; }

if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
version="$("$PYTHON" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')"
image="dpda:$version"
if docker compose version >/dev/null 2>&1; then compose=(docker compose)
elif command -v docker-compose >/dev/null; then compose=(docker-compose)
else echo "trial: neither 'docker compose' nor 'docker-compose' is installed" >&2; exit 2
fi

dir="${1:-$(mktemp -d "${TMPDIR:-/tmp}/dpda-trial.XXXXXX")}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd -P)"
case "$dir/" in
  "$checkout"/*) echo "trial: $dir is inside the checkout; keys never go there" >&2; exit 2 ;;
esac
for d in keys source target; do
  if [ -e "$dir/$d" ]; then echo "trial: $dir/$d exists; give an empty folder" >&2; exit 2; fi
done
chmod 0755 "$dir"   # the configs are public; each party's keys sit in 0700 folders below

step "1/5 wheels: dpda and its dependencies, built here (the image build reaches no index)"
rm -rf deploy/wheels
"$PYTHON" -m pip wheel --quiet --wheel-dir deploy/wheels .

step "2/5 image $image${DPDA_BASE:+ on $DPDA_BASE}"
docker build --quiet ${DPDA_BASE:+--build-arg "BASE=$DPDA_BASE"} --build-arg "VERSION=$version" \
  -f deploy/Dockerfile -t "$image" .
docker run --rm "$image" --version

step "3/5 keys for both parties in $dir/keys (made by the image's user, uid 10001)"
docker run --rm --user 0 -v "$dir:/trial" --entrypoint install "$image" \
  -d -o 10001 -g 10001 -m 0700 /trial/keys /trial/source /trial/target
keys_init() {  # ORG [HOST]: prints the certificate's fingerprint
  docker run --rm -v "$dir:/trial" "$image" keys init --org "$1" --out "/trial/keys/$1" \
    ${2:+--host "$2"} | awk '$1 == "fingerprint" {print $2}'
}
fp_source="$(keys_init source-org source)"   # the target reaches the source as "source"
fp_target="$(keys_init target-org)"
echo "source-org $fp_source"
echo "target-org $fp_target"
# Each party's mount: its own certificate and keys, and the peer's public files. The CAs'
# private keys stay in $dir/keys, which no daemon's container mounts.
docker run --rm -v "$dir:/trial" --entrypoint sh "$image" -c '
  set -e; umask 077; cd /trial
  mkdir -p source/keys source/peer target/keys target/peer
  for org in source target; do
    cp keys/$org-org/$org-org.pem keys/$org-org/$org-org.key keys/$org-org/$org-org.signing.key $org/keys/
  done
  cp keys/target-org/ca/ca.pem source/peer/target-ca.pem
  cp keys/target-org/target-org.signing.pub source/peer/
  cp keys/source-org/ca/ca.pem target/peer/source-ca.pem
  cp keys/source-org/source-org.signing.pub target/peer/'
sed "s|^cert_fingerprint = .*|cert_fingerprint = \"$fp_target\"|" deploy/source.example.toml \
  > "$dir/source.toml"
sed "s|^source_fingerprint = .*|source_fingerprint = \"$fp_source\"|" deploy/target.example.toml \
  > "$dir/target.toml"
chmod 0644 "$dir/source.toml" "$dir/target.toml"

step "4/5 compose up: the source daemon, then one job of the target once the source is healthy"
export DPDA_TRIAL_DIR="$dir" DPDA_VERSION="$version"
dc=("${compose[@]}" -p dpda-trial -f deploy/docker-compose.yml)
"${dc[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
"${dc[@]}" up --no-build --abort-on-container-exit --exit-code-from target source target

step "5/5 verify both ledgers and audit logs on their volumes"
"${dc[@]}" run --rm --no-deps source ledger verify /var/lib/dpda/source
"${dc[@]}" run --rm --no-deps source audit verify /var/lib/dpda/source
"${dc[@]}" run --rm --no-deps target ledger verify /var/lib/dpda/target
"${dc[@]}" run --rm --no-deps target audit verify /var/lib/dpda/target
# what each daemon's container sees of the keys: its own, and the peer's public files
for side in source target; do
  files="$("${dc[@]}" run --rm --no-deps --entrypoint find "$side" /etc/dpda -type f)"
  echo "$side container: $(echo $files)"
  if echo "$files" | grep -q 'ca\.key'; then echo "trial: a CA key in $side" >&2; exit 1; fi
done
"${dc[@]}" run --rm --no-deps --entrypoint python target -c '
import json
r = json.load(open("/var/lib/dpda/target/results.json"))
print(json.dumps({k: r[k] for k in ("accuracy", "epsilon_spent", "epsilon_job") if k in r}))'

if [ "${DPDA_KEEP:-0}" != 1 ]; then "${dc[@]}" down -v --remove-orphans >/dev/null 2>&1; fi
printf '\ntrial passed in %ds; keys and configs in %s\n' "$((SECONDS - start))" "$dir"
