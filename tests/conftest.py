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


@pytest.fixture(scope="module")
def store_template(tmp_path_factory):
    """A migrated MLflow SQLite store made once; each test gets a copy (migrating takes seconds)."""
    from tcl import tracking

    db = tmp_path_factory.mktemp("store-template") / "mlflow.db"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
        tracking.ensure_store()
    return db


@pytest.fixture
def store(tmp_path, monkeypatch, store_template):
    """A fresh copy of the template store as this test's MLFLOW_TRACKING_URI; returns the URI."""
    import sqlite3

    from tcl import tracking

    db = tmp_path / "registry" / "mlflow.db"
    db.parent.mkdir(parents=True)
    with sqlite3.connect(store_template) as src, sqlite3.connect(db) as dst:
        src.backup(dst)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    return tracking.ensure_store()


@pytest.fixture
def one_torch_thread():
    """Tiny tensors: one intra-op thread avoids OpenMP barrier waits on a busy 2-core box."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
