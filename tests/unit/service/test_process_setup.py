"""What a party's process sets up for itself once it has started (``dpda.service``)."""

from __future__ import annotations


def test_settling_the_heap_freezes_start_up_objects_and_still_collects_new_cycles() -> None:
    """``settle_heap`` (the daemons' and ``dpda target run``'s entry points call it once, after
    start-up): what exists then is frozen out of the cyclic collector's view, and a cycle made
    afterwards is still collected. Run in a fresh interpreter, not this test process."""
    import subprocess
    import sys

    code = (
        "import gc, weakref\n"
        "from dpda.service import settle_heap\n"
        "class Node: pass\n"
        "settle_heap()\n"
        "assert gc.get_freeze_count() > 1000, gc.get_freeze_count()\n"
        "a, b = Node(), Node(); a.other, b.other = b, a\n"
        "gone = weakref.ref(a); del a, b\n"
        "gc.collect()\n"
        "assert gone() is None\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
