"""Where tcl's compiled libraries are (torch-free: the server looks its operators up here too).

``pip install`` builds them from ``tcl/csrc`` (setup.py) next to the package's modules; each is
optional, and a caller falls back to Python or standard ops where one was not built (no C++
compiler): ``_ortops`` (onnxruntime operators, tcl.models.mamba_onnx), ``_scan_grad`` (the Mamba
block's ops for torch training, tcl.models.fused_ops).
"""

from __future__ import annotations

import importlib.machinery
from pathlib import Path


def compiled_library(stem: str) -> Path | None:
    """Path of ``tcl/<stem>*.so`` (any of this interpreter's extension suffixes), or None."""
    here = Path(__file__).resolve().parents[1]
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        p = here / f"{stem}{suffix}"
        if p.is_file():
            return p
    return None
