"""A copy of the embedded store served by a real `mlflow server`, read back over its REST API.

Shows that the SQLite registry `tcl` writes is an ordinary MLflow store a team server can host.
Needs the full `mlflow` package (extra `ui`/`dev`); skipped only when it is not installed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from tcl import registry, tracking

F, L = 10, 12
CONFIG = {"d_model": 8, "n_layers": 1, "d_state": 4, "expand": 1, "d_conv": 4}


def _full_mlflow() -> bool:
    try:
        import mlflow.server  # noqa: F401 - needs flask, only in the full package
    except ImportError:
        return False
    return True


pytestmark = [
    pytest.mark.skipif(not _full_mlflow(), reason="full mlflow (server) not installed: "
                                                  "pip install mlflow==3.17.2 (extra 'ui')"),
    pytest.mark.slow,  # the server takes ~15 s to start on 2 busy cores
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(base: str, path: str, **params) -> dict:
    url = f"{base}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def test_server_reads_registry_copy(tmp_path, monkeypatch):
    import torch

    from tcl.export import export_onnx
    from tcl.models.checkpoint import save_checkpoint
    from tcl.models.nets import build_net

    db = tmp_path / "registry" / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    tracking.ensure_store()
    torch.manual_seed(0)
    model = build_net("mamba", F, **CONFIG)
    meta = {"feature_version": "srv-fv", "max_len": L, "n_features": F}
    save_checkpoint(tmp_path / "kb.pt", model, "mamba", CONFIG, meta)
    onnx_path = export_onnx(tmp_path / "kb.pt", tmp_path / "kb.onnx", "srvfam")
    versions = []
    for top1 in (0.6, 0.7):
        with tracking.start_run("tcl-test") as run:
            rid = run.info.run_id
        versions.append(registry.register_kb(tmp_path / "kb.pt", "srvfam", ["p1", "p2"], rid,
                                             {"top1": top1, "top5": 0.9}, "E", "D",
                                             onnx_path=onnx_path))
    registry.promote("srvfam", versions[0])

    # a consistent copy of the live store (the WAL may hold recent writes)
    copy = tmp_path / "copy" / "mlflow.db"
    copy.parent.mkdir()
    with sqlite3.connect(db) as src, sqlite3.connect(copy) as dst:
        src.backup(dst)

    port = _free_port()
    # no background job runner (7 huey consumer processes) for a read-only check
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true",
               MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    env.pop("MLFLOW_TRACKING_URI")
    log = open(tmp_path / "server.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{copy}",
         "--default-artifact-root", str(tmp_path / "copy" / "artifacts"),
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 300
        while True:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            assert proc.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            assert time.time() < deadline, "mlflow server did not become healthy"
            time.sleep(0.25)

        found = _get(base, "/api/2.0/mlflow/registered-models/search", max_results=50)
        names = [m["name"] for m in found["registered_models"]]
        assert names == ["tcl-kb-srvfam"]
        rm = found["registered_models"][0]
        aliases = {a["alias"]: a["version"] for a in rm.get("aliases", [])}
        assert aliases == {"production": str(versions[0]), "candidate": str(versions[1])}

        prod = _get(base, "/api/2.0/mlflow/registered-models/alias", name="tcl-kb-srvfam",
                    alias="production")["model_version"]
        assert prod["version"] == str(versions[0])
        tags = {t["key"]: t["value"] for t in prod["tags"]}
        assert tags["platforms"] == "p1,p2" and float(tags["top1"]) == 0.6
        assert tags["feature_version"] == "srv-fv" and tags["family"] == "srvfam"
        cand = _get(base, "/api/2.0/mlflow/registered-models/alias", name="tcl-kb-srvfam",
                    alias="candidate")["model_version"]
        assert cand["version"] == str(versions[1])
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
