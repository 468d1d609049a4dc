"""A two-daemon job on one machine: the deployment's five steps, scripted.

Makes keys for both parties, writes their configs from ``deploy/*.example.toml`` (the real
fingerprints, this machine's paths, a free port), starts ``dpda source serve`` as its own
process, runs ``dpda target run`` against it over mutual TLS, and verifies both ledgers. The
data is the synthetic two-domain problem the source generates at start.

    python two_daemons.py [WORKDIR]

WORKDIR (default: a new temporary folder) must be outside any git checkout: keys never go
into one. It keeps ``source/`` and ``target/`` (the state folders) for read_ledger.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def dpda(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dpda.cli", *args], check=True, text=True, **kw)


def keys_init(work: Path, org: str) -> str:
    out = dpda(
        "keys", "init", "--org", org, "--out", str(work / "keys" / org), capture_output=True
    ).stdout
    return next(line.split()[1] for line in out.splitlines() if line.startswith("fingerprint"))


def config(example: str, replacements: dict[str, str], path: Path) -> Path:
    text = (DEPLOY / example).read_text()
    for line in text.splitlines():
        key = line.split("=", 1)[0].strip()
        if key in replacements:
            text = text.replace(line, f'{key} = "{replacements[key]}"')
    for old, new in replacements.items():
        if old.startswith("/"):
            text = text.replace(old, new)
    path.write_text(text)
    return path


def main() -> None:
    work = Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="dpda-two-"))
    work = work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    k = work / "keys"

    # 1. keys, one CA per organization
    fp_source = keys_init(work, "source-org")
    fp_target = keys_init(work, "target-org")

    # 2. configs from the examples
    source_cfg = config(
        "source.example.toml",
        {
            "state_dir": str(work / "source"),
            "listen": "127.0.0.1:0",
            "cert_fingerprint": fp_target,
            "/etc/dpda/keys/": f"{k}/source-org/",
            "/etc/dpda/peer/target-ca.pem": f"{k}/target-org/ca/ca.pem",
            "/etc/dpda/peer/": f"{k}/target-org/",
        },
        work / "source.toml",
    )

    # 3. the source daemon, as its own process; it writes its bound port to state_dir/port
    daemon = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dpda.cli",
            "source",
            "serve",
            "--config",
            str(source_cfg),
            "--log-level",
            "warning",
        ]
    )
    try:
        port_file = work / "source" / "port"
        while not port_file.exists():
            if daemon.poll() is not None:
                raise SystemExit("the source daemon exited; see its messages above")
            time.sleep(0.2)
        port = port_file.read_text().strip()

        # 4. the target's job
        target_cfg = config(
            "target.example.toml",
            {
                "state_dir": str(work / "target"),
                "source_address": f"127.0.0.1:{port}",
                "source_fingerprint": fp_source,
                "/etc/dpda/keys/": f"{k}/target-org/",
                "/etc/dpda/peer/source-ca.pem": f"{k}/source-org/ca/ca.pem",
                "/etc/dpda/peer/": f"{k}/source-org/",
            },
            work / "target.toml",
        )
        dpda("target", "plan", "--config", str(target_cfg), capture_output=True)
        dpda(
            "target",
            "run",
            "--config",
            str(target_cfg),
            "--quiet",
            "--json",
            str(work / "result.json"),
            capture_output=True,
        )
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)

    # 5. verify both ledgers, and the target's copy against the source's
    dpda("ledger", "verify", str(work / "source"))
    dpda("ledger", "verify", str(work / "target"), "--against", str(work / "source"))
    result = json.loads((work / "result.json").read_text())
    print(f"job done: ε spent {result['epsilon_spent']:.3f}; state in {work}")


if __name__ == "__main__":
    main()
