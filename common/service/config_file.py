"""Reading a TOML config file into a pydantic model: relative paths resolved against the file's
directory, and a validation error explained as ``<file>: <dotted.field>: <problem>`` (an
unknown key with the known key it most resembles)."""

from __future__ import annotations

import difflib
import tomllib
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from dpda.errors import ConfigError


def _resolve(data: object, base: Path) -> object:
    if isinstance(data, dict):
        out = {}
        for k, v in data.items():
            is_path = isinstance(v, str) and (
                k
                in {
                    "cert",
                    "key",
                    "peer_ca",
                    "signing_key",
                    "token_file",
                    "signing_public_key",
                    "state_dir",
                    "path",
                    "data_path",
                    "source_signing_public_key",
                    "tls_ca_file",
                    "tls_cert",
                    "tls_key",
                }
            )
            out[k] = str((base / v).resolve()) if is_path else _resolve(v, base)
        return out
    if isinstance(data, list):
        return [_resolve(v, base) for v in data]
    return data


def load(path: str | Path, model: type[BaseModel]) -> BaseModel:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    try:
        return model.model_validate(_resolve(raw, path.parent))
    except ValidationError as exc:
        raise ConfigError(f"{path}: {explain(exc, model)}") from None


def explain(exc: ValidationError, model: type[BaseModel]) -> str:
    """The first error as ``field: message``; an unknown key comes first, with the known key it
    most resembles ("did you mean …"), since a misspelt key also makes the intended one missing."""
    errors = exc.errors()
    extra = next((e for e in errors if e["type"] == "extra_forbidden"), None)
    err = extra or errors[0]
    field = ".".join(str(p) for p in err["loc"]) or "(top level)"
    if extra is None:
        return f"{field}: {err['msg']}"
    known = _keys_at(model, err["loc"][:-1])
    key = str(err["loc"][-1])
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if close:
        return f"{field}: unknown key {key!r}; did you mean {close[0]!r}?"
    return f"{field}: unknown key {key!r} (known keys: {', '.join(sorted(known))})"


def _keys_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The field names of the model a location inside ``model`` points into."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue  # an entry of a list of tables: the same model
        field = current.model_fields.get(str(part)) if _is_model(current) else None
        if field is None:
            return []
        current = _model_in(field.annotation)
    return list(current.model_fields) if _is_model(current) else []


def _is_model(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


def _model_in(annotation: Any) -> Any:
    """The pydantic model an annotation holds (itself, or inside a tuple, list or union)."""
    if _is_model(annotation):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
