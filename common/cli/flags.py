"""Errors of ``dpda simulate`` in the words of its command line: a setting named by the flag
that sets it, not by the config field or term it becomes."""

from __future__ import annotations

import argparse

# the settings `dpda simulate` takes under another name than the flag's: the target's
# [privacy] policy (its --target-* flags), and the terms whose flag is the field's
FLAG_OF = {
    "row_clip": "--target-row-clip",
    "target_row_queries": "--target-row-queries",
    "target_epsilon": "--target-epsilon",
    "query_epsilon": "--target-query-epsilon",
}


def flag_error(message: str, args: argparse.Namespace) -> str:
    """``message`` (``field: rule``) naming the flag that set ``field`` instead of the field,
    and in its text any other setting a flag sets: a user of ``simulate`` sets flags."""
    import re

    head, sep, rest = message.partition(": ")
    if not sep:
        return message
    flags = {k: "--" + k.replace("_", "-") for k in vars(args) if not k.startswith("_")}
    head = FLAG_OF.get(head) or flags.get(head) or head
    named = {**{k: v for k, v in flags.items() if "_" in k}, **FLAG_OF}  # words, not names
    pattern = r"(?<![-.\w])(" + "|".join(sorted(named, key=len, reverse=True)) + r")(?![-\w])"
    rest = re.sub(pattern, lambda m: named[m.group(1)], rest)
    if head == "--target-row-clip" and "natural row bound" in rest:
        rest += (
            " with --target-row-clip C (a bound on the rows' norms known without reading them),"
            " or --representation l2 (rows of norm 1, at no privacy cost)"
        )
    return f"{head}: {rest}"
