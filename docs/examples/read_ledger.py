"""Read a party's privacy ledger: what was released, under which mechanism, and what it cost.

``dpda ledger show STATE_DIR --json OUT`` writes the entries; each names its dataset, peer,
session and request, the privacy unit and relation, the dp-accounting event it was charged as,
the dataset's ε after it, the SHA-256 of the payload that was sent, and the two signatures
(the source's, and the target's countersignature). ``dpda ledger verify`` checks all of it.

    python read_ledger.py STATE_DIR

STATE_DIR is a daemon's ``state_dir`` (two_daemons.py leaves ``WORKDIR/source`` and
``WORKDIR/target``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path


def event_summary(event: dict) -> str:
    """The event as one line: its type and its noise parameters."""
    if event.get("type") == "ComposedDpEvent":
        return " + ".join(event_summary(e) for e in event["events"])
    params = ", ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
        for k, v in event.items()
        if k != "type" and not isinstance(v, dict)
    )
    return f"{event['type'].removesuffix('DpEvent')}({params})"


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    state = Path(sys.argv[1])
    out = Path(tempfile.mkdtemp()) / "ledger.json"
    subprocess.run(
        [sys.executable, "-m", "dpda.cli", "ledger", "show", str(state), "--json", str(out)],
        check=True,
        capture_output=True,
    )
    entries = json.loads(out.read_text())
    for e in entries:
        signed = "signed" + (", countersigned" if e.get("target_sig") else "")
        print(
            f"#{e['seq']} {e['dataset']} for {e['peer']}: {e['privacy_unit']} unit, "
            f"{e['neighbouring']}; {event_summary(e['dp_event'])}"
        )
        print(
            f"    dataset ε after it {e['spend_after']:.4f}; payload sha256 "
            f"{e['payload_sha256'][:16]}…; {signed}"
        )
    verified = subprocess.run([sys.executable, "-m", "dpda.cli", "ledger", "verify", str(state)])
    sys.exit(verified.returncode)


if __name__ == "__main__":
    main()
