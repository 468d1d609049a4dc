"""Strip the debug sections from the extension modules inside wheels, in place.

Some dependencies ship their extension modules unstripped (POT's ``ot/bsp`` module is 167 MB
with its symbols, 1 MB without); the image installs the wheels as they are, so they are
stripped here, before the build. Each wheel is rewritten with its ``RECORD`` (hashes and
sizes) made again for the stripped files; nothing else in it changes.

Usage: python deploy/strip_wheels.py WHEEL_DIR (needs ``strip``, from binutils).
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

MIN_BYTES = 1 << 20  # smaller libraries are not worth rewriting their wheel


def _digest(data: bytes) -> str:
    raw = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def strip_wheel(wheel: Path, strip: str) -> int:
    """Strips the wheel's large ``.so`` files; returns the bytes saved (0: left unchanged)."""
    with zipfile.ZipFile(wheel) as zf:
        infos = zf.infolist()
        files = {i.filename: zf.read(i) for i in infos}
    # only the package's own modules with debug sections: the libraries auditwheel vendors
    # (``*.libs/``) are patched with patchelf and break when stripped
    big = [
        i
        for i in infos
        if ".so" in Path(i.filename).suffixes
        and i.file_size >= MIN_BYTES
        and ".libs/" not in i.filename
        and b".debug_info" in files[i.filename]
    ]
    if not big:
        return 0
    saved = 0
    with tempfile.TemporaryDirectory() as tmp:
        for info in big:
            path = Path(tmp) / "lib.so"
            path.write_bytes(files[info.filename])
            subprocess.run([strip, "--strip-debug", str(path)], check=True)
            data = path.read_bytes()
            saved += len(files[info.filename]) - len(data)
            files[info.filename] = data
    record = next(n for n in files if n.endswith(".dist-info/RECORD"))
    lines = []
    for line in files[record].decode().splitlines():
        name = line.split(",", 1)[0]
        if name in files and name != record:
            lines.append(f"{name},{_digest(files[name])},{len(files[name])}")
        else:
            lines.append(line)
    files[record] = ("\n".join(lines) + "\n").encode()
    out = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for info in infos:
            zf.writestr(info, files[info.filename])
    out.replace(wheel)
    return saved


def main(argv: list[str]) -> int:
    strip = shutil.which("strip")
    if strip is None:
        print("strip_wheels: no strip (apt-get install binutils); the wheels stay as they are")
        return 0
    total = 0
    for wheel in sorted(Path(argv[1]).glob("*.whl")):
        saved = strip_wheel(wheel, strip)
        if saved:
            print(f"strip_wheels: {wheel.name}: {saved / 1e6:.0f} MB of symbols removed")
        total += saved
    print(f"strip_wheels: {total / 1e6:.0f} MB removed in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
