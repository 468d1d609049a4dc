#!/usr/bin/env bash
# The container trial, end to end, from a fresh checkout: wheels for the image's own Python,
# the image (≤ 600 MB), keys for both parties, configs with the real fingerprints, one job
# through compose during which the source's container is killed and restarted (the job resumes
# and nothing is charged twice), then `dpda ledger verify` (each party alone, and each against
# the other) and `dpda audit verify` on both parties' volumes.
#
#   deploy/trial.sh [TRIAL_DIR]
#
# TRIAL_DIR (default: a new folder under $TMPDIR) holds the keys and the configs; it must be
# outside the checkout. Environment:
#   DPDA_BASE   the base image (default: the Dockerfile's, the official slim Python image;
#               where no image can be pulled, deploy/make-base.sh builds dpda-base:bookworm)
#   PYTHON      the Python (≥ 3.11, with pip) that fetches the wheels (default: .venv/bin/python,
#               else python3); the wheels are for the base image's Python, whatever this one is
#   DPDA_KEEP=1 leave the containers and volumes in place afterwards
# Needs Docker (a running daemon) and Compose (`docker compose` or `docker-compose`), and a
# package index for `pip download`. The data is the public synthetic problem the source
# generates at start.
set -euo pipefail
cd "$(dirname "$0")/.."
checkout="$(pwd -P)"
start=$SECONDS
step() { printf '\n== %s (%ds)\n' "$1" "$((SECONDS - start))"; }
need() { echo "trial: $1" >&2; exit 2; }
MAX_IMAGE_MB=600

step "0/6 prerequisites"
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
command -v "$PYTHON" >/dev/null || need "no $PYTHON: install Python ≥ 3.11 (apt-get install python3 python3-venv) or set PYTHON"
"$PYTHON" -m pip --version >/dev/null 2>&1 || need "$PYTHON has no pip: apt-get install python3-pip, or set PYTHON to a virtual environment's python"
command -v docker >/dev/null || need "no docker command: install Docker (apt-get install docker.io)"
docker info >/dev/null 2>&1 || need "no Docker daemon answers: start it (systemctl start docker, or dockerd &) and check that this user may use it"
if docker compose version >/dev/null 2>&1; then compose=(docker compose)
elif command -v docker-compose >/dev/null; then compose=(docker-compose)
else need "neither 'docker compose' nor 'docker-compose' is installed (apt-get install docker-compose)"
fi
version="$("$PYTHON" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')"
image="dpda:$version"
base="${DPDA_BASE:-$(sed -n 's/^ARG BASE=//p' deploy/Dockerfile)}"
if ! docker image inspect "$base" >/dev/null 2>&1 && ! docker pull --quiet "$base" >/dev/null 2>&1; then
  need "base image $base: not here and it cannot be pulled; build one with 'sudo deploy/make-base.sh' (needs debootstrap: apt-get install debootstrap) and run DPDA_BASE=dpda-base:bookworm $0"
fi
# the wheels are fetched for the base's Python: its version and the machine's architecture
pyver="$(docker run --rm --entrypoint python3 "$base" -c '
import sys, venv, ensurepip
print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" \
  || need "base image $base: no python3 with its venv and ensurepip modules (on Debian: python3 python3-venv)"
case "$pyver" in
  3.1[1-9]) ;;
  *) need "base image $base has Python $pyver; dpda needs ≥ 3.11" ;;
esac
arch="$(docker run --rm --entrypoint uname "$base" -m)"
echo "docker $(docker version --format '{{.Server.Version}}'), ${compose[*]}, base $base (Python $pyver, $arch)"

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

step "1/6 wheels: dpda, and its dependencies for the base's Python $pyver (the image build reaches no index)"
rm -rf deploy/wheels
"$PYTHON" -m pip wheel --quiet --no-deps --wheel-dir deploy/wheels .
"$PYTHON" -m pip download --quiet --dest deploy/wheels --only-binary=:all: \
  --python-version "$pyver" --implementation cp --abi "cp${pyver/./}" \
  --platform "manylinux_2_28_$arch" --platform "manylinux2014_$arch" deploy/wheels/dpda-*.whl
"$PYTHON" deploy/strip_wheels.py deploy/wheels   # debug symbols: 170 MB of the image otherwise

step "2/6 image $image on $base"
docker build --quiet --build-arg "BASE=$base" --build-arg "VERSION=$version" \
  -f deploy/Dockerfile -t "$image" .
docker run --rm "$image" --version
size_mb=$(( $(docker image inspect -f '{{.Size}}' "$image") / 1000000 ))
echo "image $image: $size_mb MB"
if [ "$size_mb" -gt "$MAX_IMAGE_MB" ]; then echo "trial: the image is over $MAX_IMAGE_MB MB" >&2; exit 1; fi
[ "$(docker image inspect -f '{{.Config.User}}' "$image")" = "10001:10001" ] \
  || { echo "trial: the image does not run as uid 10001" >&2; exit 1; }

step "3/6 keys for both parties in $dir/keys (made by the image's user, uid 10001)"
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

step "4/6 compose up: the source daemon, then one job of the target once the source is healthy"
export DPDA_TRIAL_DIR="$dir" DPDA_VERSION="$version"
# one Compose project per trial folder: two trials on one host (two CI runs) never touch
# each other's containers or volumes
project="dpda-trial-$(printf %s "$dir" | sha256sum | cut -c1-8)"
dc=("${compose[@]}" -p "$project" -f deploy/docker-compose.yml -f deploy/trial-fault.yml)
"${dc[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
# whatever happens below, the containers and volumes go (DPDA_KEEP=1 keeps them)
trap 'if [ "${DPDA_KEEP:-0}" != 1 ]; then "${dc[@]}" down -v --remove-orphans >/dev/null 2>&1; fi' EXIT
"${dc[@]}" up --no-build --detach source target
cid() { "${dc[@]}" ps -q "$1"; }
src_id="$(cid source)" tgt_id="$(cid target)"

step "5/6 fault: the source crashes mid-job (its first release charged and signed, not yet sent), its restart policy restarts it"
# deploy/trial-fault.yml: SIGKILL at the crash point source.release.signed in the source's
# first life only; the job must retry the release and get the stored one, charged once
# the containers are new (down -v above): any restart is the crash's, even one that came before
# this line could read a count (a fast job reaches the crash point within a second of `up`)
crashed() { [ "$(docker inspect -f '{{.RestartCount}}' "$src_id")" != 0 ]; }
for _ in $(seq 6000); do   # 600 s: a loaded machine starts two Python daemons slowly
  crashed && break
  # the job ended before the source reached its crash point: nothing more will come
  [ "$(docker inspect -f '{{.State.Status}}' "$tgt_id")" = exited ] && break
  sleep 0.1
done
crashed || {
  echo "trial: the source never reached its crash point (target: $(docker inspect \
    -f '{{.State.Status}}, exit {{.State.ExitCode}}' "$tgt_id"))" >&2
  "${dc[@]}" logs --no-color --tail 30 source target >&2
  exit 1
}
"${dc[@]}" logs --no-color source | grep -m1 'dpda crash point' \
  || { echo "trial: the source restarted, but not from its crash point" >&2; exit 1; }
echo "source killed at its crash point (SIGKILL, as a crash): its restart policy restarted it"
for _ in $(seq 100); do
  [ "$(docker inspect -f '{{.State.Running}}' "$src_id")" = true ] && break; sleep 0.1
done
echo "source restarted: $(docker inspect -f '{{.State.Status}}, restarts {{.RestartCount}}' "$src_id")"
job_exit="$(docker wait "$tgt_id")"
job_log="$("${dc[@]}" logs --no-color target)"
echo "$job_log" | tail -20
[ "$job_exit" = 0 ] || { echo "trial: the target's job exited with $job_exit" >&2; exit 1; }
echo "target exited with code 0"
retried="$(echo "$job_log" | grep -c 'source unavailable; retrying' || true)"
[ "$retried" -gt 0 ] || { echo "trial: the job never met the fault (no call retried)" >&2; exit 1; }
echo "the job retried $retried call(s) while the source was down, and finished"

step "6/6 verify both ledgers and audit logs on their volumes, each ledger against the other's"
"${dc[@]}" run --rm --no-deps source ledger verify /var/lib/dpda/source
"${dc[@]}" run --rm --no-deps source audit verify /var/lib/dpda/source
"${dc[@]}" run --rm --no-deps target ledger verify /var/lib/dpda/target
"${dc[@]}" run --rm --no-deps target audit verify /var/lib/dpda/target
both=(docker run --rm -v "${project}_source-state":/var/lib/dpda/source
      -v "${project}_target-state":/var/lib/dpda/target "$image")
"${both[@]}" ledger verify /var/lib/dpda/source --against /var/lib/dpda/target
"${both[@]}" ledger verify /var/lib/dpda/target --against /var/lib/dpda/source
# what each daemon's container sees of the keys: its own, and the peer's public files
for side in source target; do
  files="$("${dc[@]}" run --rm --no-deps --entrypoint find "$side" /etc/dpda -type f)"
  echo "$side container: $(echo $files)"
  if echo "$files" | grep -q 'ca\.key'; then echo "trial: a CA key in $side" >&2; exit 1; fi
done
# the job's results (state_dir/jobs/<id>/), and no release charged twice across the restart
docker run --rm -v "${project}_source-state":/s -v "${project}_target-state":/t --entrypoint python \
  "$image" -c '
import glob, json, os, sqlite3, sys
jobs = sorted(glob.glob("/t/jobs/*/results.json"), key=os.path.getmtime)
if len(jobs) != 1:
    sys.exit(f"trial: {len(jobs)} jobs in the target state, expected 1")
r = json.load(open(jobs[0]))
print(json.dumps({k: r[k] for k in ("job_id", "accuracy", "epsilon_job", "epsilon_spent",
                                    "batches", "target_epsilon_spent") if k in r}))
def ids(path):
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = db.execute("SELECT entry_json FROM ledger WHERE dataset = ?", ("synthetic",))
    return [json.loads(e)["request_id"] for (e,) in rows]
src, tgt = ids("/s/state.sqlite"), ids("/t/state.sqlite")
print(f"source ledger: {len(src)} charges, {len(set(src))} distinct; target ledger: {len(tgt)}")
if len(src) != len(set(src)) or sorted(src) != sorted(tgt) or not src:
    sys.exit("trial: a release charged twice, or the two ledgers differ")
print("no release charged twice")'

printf '\ntrial passed in %ds (image %s MB); keys and configs in %s\n' "$((SECONDS - start))" "$size_mb" "$dir"
