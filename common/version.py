"""The installed distribution's version (``dpda --version``, the admin API's schema)."""

from __future__ import annotations

from importlib import metadata

try:
    __version__ = metadata.version("dpda")
except metadata.PackageNotFoundError:  # run from a checkout that was never installed
    __version__ = "0+unknown"
