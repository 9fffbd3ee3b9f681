"""TCL: a transferable cost model for tensor-program optimization."""

from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"


def compiled_library(stem: str) -> Path | None:
    """Path of one of tcl's compiled shared objects (``tcl/<stem>*.so``, built by ``pip install``;
    setup.py), or None where it was not built (no C++ compiler)."""
    import importlib.machinery

    here = Path(__file__).resolve().parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        p = here / f"{stem}{suffix}"
        if p.is_file():
            return p
    return None
