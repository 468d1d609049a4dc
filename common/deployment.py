"""Throw-away two-party deployments on loopback: keys, configs, daemon processes.

Used by ``dpda demo``, the integration tests and ``dpda bench service``. Everything is written
under one work directory (never inside a git checkout): ``keys/``, ``source/`` and ``target/``
state directories and the two TOML configs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpda.service.tls import PartyKeys, init_party


@dataclass(frozen=True)
class Deployment:
    workdir: Path
    source_keys: PartyKeys
    target_keys: PartyKeys
    source_config: Path
    target_config: Path

    @property
    def source_state(self) -> Path:
        return self.workdir / "source"

    @property
    def target_state(self) -> Path:
        return self.workdir / "target"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):  # an inline table
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, int | float):
        return repr(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _table(name: str, values: dict[str, Any], array: bool = False) -> str:
    head = f"[[{name}]]" if array else f"[{name}]"
    return head + "\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in values.items()) + "\n"


def make_deployment(
    workdir: Path,
    *,
    dataset: dict[str, Any],
    job: dict[str, Any],
    source_extra: dict[str, Any] | None = None,
    peer_cap: float = 100.0,
    target_budget: float = 100.0,
    address: str = "",
    source_host: str = "127.0.0.1",
    target_privacy: dict[str, Any] | None = None,
) -> Deployment:
    """Keys for both parties (one throw-away CA), and ``source.toml`` / ``target.toml``."""
    workdir = workdir.resolve()
    keys = workdir / "keys"
    sk = init_party(keys, "source-org", hosts=("localhost", source_host))
    tk = init_party(keys, "target-org", ca_dir=keys / "ca")
    src = {
        "state_dir": str(workdir / "source"),
        "listen": f"{source_host}:0",
        "signing_key": str(sk.signing_key),
        **(source_extra or {}),
    }
    text = "".join(f"{k} = {_toml_value(v)}\n" for k, v in src.items()) + "\n"
    text += _table("tls", {"cert": sk.cert, "key": sk.key, "peer_ca": sk.ca})
    text += _table("datasets", dataset, array=True)
    text += _table(
        "peers",
        {
            "name": "target-org",
            "cert_fingerprint": tk.fingerprint,
            "signing_public_key": tk.signing_pub,
            "epsilon_cap": peer_cap,
        },
        array=True,
    )
    source_cfg = workdir / "source.toml"
    source_cfg.write_text(text)
    tgt = {
        "state_dir": str(workdir / "target"),
        "source_address": address or "127.0.0.1:0",
        "source_fingerprint": sk.fingerprint,
        "source_signing_public_key": str(sk.signing_pub),
        "signing_key": str(tk.signing_key),
        "budget_epsilon": target_budget,
    }
    text = "".join(f"{k} = {_toml_value(v)}\n" for k, v in tgt.items()) + "\n"
    text += _table("tls", {"cert": tk.cert, "key": tk.key, "peer_ca": tk.ca})
    text += _table("job", job)
    if target_privacy:  # else the target's default policy: DP disclosures
        text += _table("privacy", target_privacy)
    target_cfg = workdir / "target.toml"
    target_cfg.write_text(text)
    return Deployment(workdir, sk, tk, source_cfg, target_cfg)


def trust_target_of(dep: Deployment, target: Deployment) -> None:
    """``dep``'s source trusts ``target``'s target instead of its own deployment's: the CA
    that signed the target's certificate (``[tls] peer_ca``), and the peer's certificate
    fingerprint and signing key (``[[peers]]``). Several organizations' sources, one target."""
    tk = target.target_keys
    out = []
    for line in dep.source_config.read_text().splitlines():
        key = line.split(" = ", 1)[0]
        if key == "peer_ca":
            line = f"peer_ca = {_toml_value(tk.ca)}"
        elif key == "cert_fingerprint":
            line = f"cert_fingerprint = {_toml_value(tk.fingerprint)}"
        elif key == "signing_public_key":
            line = f"signing_public_key = {_toml_value(tk.signing_pub)}"
        out.append(line)
    dep.source_config.write_text("\n".join(out) + "\n")


def add_sources(target: Deployment, first: str, more: dict[str, tuple[Deployment, str]]) -> None:
    """``target``'s job over several sources: its own source named ``first``, and each of
    ``more`` (name → (its deployment, its address)) as a ``[[sources]]`` table with its pinned
    fingerprint, signing key and CA."""
    text = target.target_config.read_text()
    tables = "".join(
        _table(
            "sources",
            {
                "name": name,
                "address": address,
                "fingerprint": dep.source_keys.fingerprint,
                "signing_public_key": dep.source_keys.signing_pub,
                "peer_ca": dep.source_keys.ca,
            },
            array=True,
        )
        for name, (dep, address) in more.items()
    )
    target.target_config.write_text(f"source_name = {_toml_value(first)}\n" + text + "\n" + tables)


def set_source_address(dep: Deployment, address: str) -> None:
    text = dep.target_config.read_text()
    lines = [
        f"source_address = {_toml_value(address)}" if ln.startswith("source_address") else ln
        for ln in text.splitlines()
    ]
    dep.target_config.write_text("\n".join(lines) + "\n")


def _listen_host(config: Path) -> str:
    for line in config.read_text().splitlines():
        if line.startswith("listen"):
            return line.split("=", 1)[1].strip().strip('"').rsplit(":", 1)[0]
    return "127.0.0.1"


def dpda_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "dpda.cli", *args]


class SourceProcess:
    """``dpda source serve`` as a real child process; ``port`` once it listens."""

    def __init__(
        self, dep: Deployment, log_path: Path | None = None, prefix: tuple[str, ...] = ()
    ) -> None:
        self.dep = dep
        port_file = dep.source_state / "port"
        port_file.unlink(missing_ok=True)
        self.log_path = log_path or dep.workdir / "source.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [*prefix, *dpda_command("source", "serve", "--config", str(dep.source_config))],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        deadline = time.monotonic() + 60
        while not port_file.is_file():
            if self.proc.poll() is not None:
                raise RuntimeError(f"source exited early; see {self.log_path}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError("source did not start within 60 s")
            time.sleep(0.05)
        self.port = int(port_file.read_text())
        host = _listen_host(dep.source_config)
        set_source_address(dep, f"{host}:{self.port}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL: no cleanup, no graceful shutdown (fault tests)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


def run_target(
    dep: Deployment, *extra: str, timeout: float = 600, prefix: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            *prefix,
            *dpda_command("target", "run", "--config", str(dep.target_config), "--quiet", *extra),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
