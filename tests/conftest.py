import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(os.environ.get("TCL_FIXTURES", REPO.parent / "shared" / "fixtures"))
BUNDLED_FIXTURES = REPO / "tests" / "fixtures"


def _measurable_here(platform: str) -> bool:
    from tcl.hardware import get_platform, require_measurable

    try:
        require_measurable(get_platform(platform), here=True)
    except ValueError:
        return False
    return True


# The bundled platform the tests that measure on this host use: the bundle's own AVX-512 one where
# this CPU runs its code, else the AVX2 one, else the generic x86-64 one (any x86-64 CPU runs it)
LOCAL_PLATFORM = next((p for p in ("znver4-avx512-t2", "x86-avx2-t2") if _measurable_here(p)), "x86-sse-t2")


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


# --- processes a test leaves behind --------------------------------------------------------------
# TVM's RPC tracker and server, MetaSchedule's builder/runner pools and the MLflow server each run
# helper processes (tvm.exec.popen_worker, gunicorn workers) that outlive their parent when only
# the parent is stopped. Every process the tests start inherits this session's mark in its
# environment, so one still running at the end is found even after it was re-parented to init.

SESSION_MARK = "TCL_TEST_SESSION"


def stop_process_tree(proc, timeout: float = 10.0) -> None:
    """Stop a started process (subprocess.Popen) and every process under it."""
    import psutil

    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    proc.terminate()
    for p in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    _, alive = psutil.wait_procs(tree, timeout=timeout)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()


def _marked_processes(mark: str, since: float) -> list:
    import psutil

    found = []
    for p in psutil.process_iter(["pid", "create_time"]):
        if p.pid == os.getpid() or (p.info["create_time"] or 0) < since:
            continue
        try:
            if p.environ().get(SESSION_MARK) == mark and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@pytest.fixture(scope="session", autouse=True)
def no_leftover_processes():
    """Fail the session when a process started by the tests is still running at its end."""
    import time
    import uuid

    import psutil

    mark, since = uuid.uuid4().hex, time.time() - 1
    os.environ[SESSION_MARK] = mark
    yield
    leftover = _marked_processes(mark, since)
    if leftover:  # give processes on their way out a moment before calling them left behind
        _, leftover = psutil.wait_procs(leftover, timeout=30)
    if leftover:
        described = []
        for p in leftover:
            with contextlib.suppress(psutil.NoSuchProcess):
                described.append(f"{p.pid}: {' '.join(p.cmdline())[:160]}")
                p.kill()  # started by this session (it carries the mark): ours to stop
        pytest.fail("processes started by the tests were left running (now killed):\n  "
                    + "\n  ".join(described), pytrace=False)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_tracker(port: int, key: str | None = None, procs=(), deadline_s: float = 180.0) -> None:
    """Until the local RPC tracker on `port` answers and, with `key`, lists a server under it
    (a fixed sleep is too short for a server that imports TVM on a busy machine)."""
    import socket
    import time

    from tvm import rpc as tvm_rpc

    end = time.monotonic() + deadline_s
    while True:
        for p in procs:
            assert p.poll() is None, f"{p.args[:3]} exited with {p.returncode} before the tracker was ready"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            if key is None or key in tvm_rpc.connect_tracker("127.0.0.1", port).summary().get("queue_info", {}):
                return
        except Exception:  # noqa: BLE001 - not up yet (TVM raises several kinds)
            pass
        assert time.monotonic() < end, f"RPC tracker :{port} not ready (key {key!r}) after {deadline_s:.0f} s"
        time.sleep(0.5)


@contextlib.contextmanager
def rpc_tracker_and_server(key: str):
    """A local TVM RPC tracker with one server registered under `key`; yields the tracker's port.
    Both processes (and their children) are stopped on exit."""
    import time

    port, server_port = free_port(), free_port()
    env = {**os.environ, "TVM_NUM_THREADS": "1"}
    tracker = subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1",
                                "--port", str(port), "--port-end", str(port + 1), "--silent"], env=env)
    server = None
    try:
        wait_for_tracker(port, procs=(tracker,))
        server = subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_server", "--tracker", f"127.0.0.1:{port}",
                                   "--key", key, "--host", "127.0.0.1", "--port", str(server_port),
                                   "--port-end", str(server_port + 50), "--silent"], env=env)
        wait_for_tracker(port, key, procs=(tracker, server))
        yield port
    finally:
        for p in (server, tracker):
            if p is not None:
                stop_process_tree(p)
