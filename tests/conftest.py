import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(os.environ.get("TCL_FIXTURES", REPO.parent / "shared" / "fixtures"))
BUNDLED_FIXTURES = REPO / "tests" / "fixtures"


def fixture_path(rel: str) -> Path:
    """Real public data: tests/fixtures (bundled copy) first, then ../shared/fixtures."""
    for root in (BUNDLED_FIXTURES, FIXTURES):
        if (root / rel).exists():
            return root / rel
    pytest.skip(f"fixture {rel} not found")


def run_tcl(*args, check=True, cwd=None, env=None):
    """Run the real `tcl` CLI in a subprocess; returns CompletedProcess."""
    proc = subprocess.run([sys.executable, "-m", "tcl.cli", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, env={**os.environ, **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"tcl {' '.join(map(str, args))} failed ({proc.returncode}):\n"
                             f"{proc.stdout}\n{proc.stderr}")
    return proc
