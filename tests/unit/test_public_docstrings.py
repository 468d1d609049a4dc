"""Every public name (``dpda.__all__``) documents every parameter in numpydoc form: its
``Parameters`` section (for a pydantic model, ``Attributes`` or ``Parameters``) names each
parameter of the signature (each field of the model) and nothing else, a function that returns
something has a ``Returns`` section, and the API reference renders each name from its
docstring."""

from __future__ import annotations

import importlib.util
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import dpda

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = [name for name in dpda.__all__ if name != "__version__"]
DASHES = re.compile(r"-{3,}")


def sections(doc: str) -> dict[str, list[str]]:
    """The numpydoc sections of ``doc``: each header (a line underlined by dashes) and the
    lines under it, dedented as ``inspect.cleandoc`` does."""
    lines = inspect.cleandoc(doc).splitlines()
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for i, line in enumerate(lines):
        if DASHES.fullmatch(line.strip()):
            continue
        if line.strip() and i + 1 < len(lines) and DASHES.fullmatch(lines[i + 1].strip()):
            current = out.setdefault(line.strip(), [])
        elif current is not None:
            current.append(line)
    return out


def entries(lines: list[str]) -> list[str]:
    """The names a section's entries give: ``name : type`` or ``a, b, c`` lines, not indented
    (the indented lines under them describe them)."""
    names: list[str] = []
    for line in lines:
        if line.strip() and not line[0].isspace():
            names += [n.strip() for n in line.split(" : ", 1)[0].split(",")]
    return names


def expected(obj: Any) -> set[str]:
    """A pydantic model's fields; else the parameters of the signature (a class's
    constructor), without ``*args`` and ``**kwargs``."""
    if isinstance(obj, type) and issubclass(obj, BaseModel):
        return set(obj.model_fields)
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return {n for n, p in inspect.signature(obj).parameters.items() if p.kind not in variadic}


def problems(obj: Any) -> list[str]:
    """What ``obj``'s own docstring lacks or names wrongly (empty: nothing)."""
    doc = obj.__doc__
    if not doc or not doc.strip():
        return ["no docstring"]
    found = sections(doc)
    params = entries(found.get("Parameters", []))
    documented = set(params)
    if isinstance(obj, type) and issubclass(obj, BaseModel):
        documented |= set(entries(found.get("Attributes", [])))
    want = expected(obj)
    out = [f"{name}: not in its Parameters section" for name in sorted(want - documented)]
    out += [f"{name}: documented, but no parameter" for name in sorted(set(params) - want)]
    twice = {n for n in params if params.count(n) > 1}
    out += [f"{name}: documented twice" for name in sorted(twice)]
    if want and not documented:
        out.append("no Parameters section")
    if inspect.isfunction(obj):
        returns = inspect.signature(obj).return_annotation
        if returns not in (inspect.Signature.empty, None, "None") and "Returns" not in found:
            out.append("returns a value, but has no Returns section")
    return out


def public(name: str) -> Any:
    """``dpda.<name>``; skipped where it needs an extra that is not installed."""
    if name == "DPDASkadaEstimator" and importlib.util.find_spec("skada") is None:
        pytest.skip("needs skada")
    return getattr(dpda, name)


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_name_documents_every_parameter(name: str) -> None:
    obj = public(name)
    assert expected(obj), f"{name}: no parameters found to check"
    assert problems(obj) == [], name


def test_the_checker_reports_what_a_docstring_lacks() -> None:
    def fake(alpha: int, beta: float = 1.0) -> float:
        """Add.

        Parameters
        ----------
        alpha : int
            The first.
        gamma : float
            Not a parameter.
        """
        return alpha + beta

    class Fake(BaseModel):
        """A model.

        Attributes
        ----------
        x : int
            Documented.
        """

        x: int
        y: int = 0

    def grouped(a: int, b: int, c: int) -> None:
        """Grouped names.

        Parameters
        ----------
        a, b
            Two of them.
        """

    def undocumented(a: int) -> int:
        return a

    assert problems(fake) == [
        "beta: not in its Parameters section",
        "gamma: documented, but no parameter",
        "returns a value, but has no Returns section",
    ]
    assert problems(Fake) == ["y: not in its Parameters section"]
    assert problems(grouped) == ["c: not in its Parameters section"]
    assert problems(undocumented) == ["no docstring"]


def test_the_api_reference_renders_every_public_name_with_numpydoc_sections() -> None:
    api = (ROOT / "docs" / "api.md").read_text()
    for name in PUBLIC:
        if name == "DPDASkadaEstimator" and importlib.util.find_spec("skada") is None:
            continue  # its module imports skada
        where = f"{getattr(dpda, name).__module__}.{name}"
        assert re.search(rf"^::: {re.escape(where)}$", api, re.M), where
    config = (ROOT / "mkdocs.yml").read_text()
    assert re.search(r"^ +docstring_style: numpy$", config, re.M)
