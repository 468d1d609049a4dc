"""The two daemons as two hosts: separate network namespaces joined by a veth pair.

Addresses are the project's own test hosts inside namespaces this test makes (and removes);
nothing leaves the machine. Skipped with a reason where namespaces cannot be made.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess

import pytest

from dpda.deployment import SourceProcess, make_deployment, run_target

from .helpers import DELTA


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


@pytest.fixture
def two_hosts():
    if shutil.which("ip") is None or os.geteuid() != 0:
        pytest.skip("needs root and iproute2 to make network namespaces")
    tag = secrets.token_hex(3)
    src, tgt = f"dpda-s-{tag}", f"dpda-t-{tag}"
    if _ip("netns", "add", src).returncode != 0:
        pytest.skip("this machine does not allow network namespaces")
    _ip("netns", "add", tgt)
    octet = int(tag[:2], 16) % 200 + 20
    a, b = f"10.231.{octet}.1", f"10.231.{octet}.2"
    try:
        steps = [
            ("link", "add", f"vs{tag}", "type", "veth", "peer", "name", f"vt{tag}"),
            ("link", "set", f"vs{tag}", "netns", src),
            ("link", "set", f"vt{tag}", "netns", tgt),
            ("-n", src, "addr", "add", f"{a}/24", "dev", f"vs{tag}"),
            ("-n", tgt, "addr", "add", f"{b}/24", "dev", f"vt{tag}"),
            ("-n", src, "link", "set", f"vs{tag}", "up"),
            ("-n", tgt, "link", "set", f"vt{tag}", "up"),
            ("-n", src, "link", "set", "lo", "up"),
            ("-n", tgt, "link", "set", "lo", "up"),
        ]
        for step in steps:
            r = _ip(*step)
            if r.returncode != 0:
                pytest.skip(f"could not build the veth link: {r.stderr.strip()}")
        yield src, tgt, a
    finally:
        _ip("netns", "del", src)
        _ip("netns", "del", tgt)


def test_job_across_two_hosts_and_admin_stays_local(two_hosts, tmp_path) -> None:
    src_ns, tgt_ns, src_addr = two_hosts
    dep = make_deployment(
        tmp_path,
        dataset={"name": "synthetic", "kind": "synthetic", "epsilon": 100.0, "delta": DELTA},
        job={
            "dataset": "synthetic",
            "data_kind": "synthetic",
            "epsilon": 4.0,
            "delta": DELTA,
            "projection_dim": 10,
        },
        source_host=src_addr,
        target_privacy={"disclosures": "exact"},
    )
    proc = SourceProcess(dep, prefix=("ip", "netns", "exec", src_ns))
    try:
        res = run_target(dep, prefix=("ip", "netns", "exec", tgt_ns))
        assert res.returncode == 0, res.stderr[-2000:]
        assert "accuracy" in res.stdout
        admin_port = int((dep.source_state / "admin_port").read_text())
        probe = (
            "import sys, urllib.request\n"
            "try:\n"
            "    urllib.request.urlopen(sys.argv[1], timeout=3)\n"
            "    print('reachable')\n"
            "except OSError:\n"
            "    print('unreachable')\n"
        )
        for host in (src_addr, "127.0.0.1"):
            url = f"http://{host}:{admin_port}/healthz"
            out = subprocess.run(
                ["ip", "netns", "exec", tgt_ns, "python3", "-c", probe, url],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert out.stdout.strip() == "unreachable", (host, out.stdout, out.stderr)
        inside = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                src_ns,
                "python3",
                "-c",
                probe,
                f"http://127.0.0.1:{admin_port}/healthz",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert inside.stdout.strip() == "reachable"  # the admin API is up, just not exposed
    finally:
        proc.stop()
