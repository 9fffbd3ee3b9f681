"""MLflow tracking store: where it lives, creating it safely, and run provenance.

The default store is an embedded SQLite database under ``<repo>/registry/mlflow.db`` (no server
to start). Artifacts of runs go to ``<repo>/registry/artifacts/<experiment>``. ``MLFLOW_TRACKING_URI``
overrides the store (another SQLite file, or an ``http://`` tracking server for a team).

Several processes that create a fresh SQLite store at the same moment corrupt it, so
:func:`ensure_store` creates and migrates the schema once, under a file lock beside the database,
and switches the database to WAL so concurrent logging afterwards is safe.

Everything MLflow-related is imported lazily: importing this module is cheap.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
from pathlib import Path
from typing import Iterator

DB_RELPATH = "registry/mlflow.db"
ARTIFACTS_DIRNAME = "artifacts"
_READY: set[str] = set()  # tracking URIs ensured by this process


def repo_root(start: str | os.PathLike | None = None) -> Path:
    """The nearest directory at or above `start` (default: cwd) holding ``params.yaml``.

    Falls back to `start` itself when no ``params.yaml`` is found.
    """
    here = Path(start or os.getcwd()).resolve()
    for d in (here, *here.parents):
        if (d / "params.yaml").is_file():
            return d
    return here


def tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` if set, else the absolute ``sqlite:///<repo>/registry/mlflow.db``.

    The default is absolute on purpose: a relative SQLite URI is lost when DVC runs an experiment
    in a temporary copy of the workspace (``dvc exp run --temp``).
    """
    env = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if env:
        return env
    return "sqlite:///" + str(repo_root() / DB_RELPATH)


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI, or None for any other store."""
    if not uri.startswith("sqlite:///"):
        return None
    p = uri[len("sqlite:///"):].split("?", 1)[0]
    if not p or p == ":memory:":
        return None
    return Path(p).resolve()


def artifact_root(uri: str | None = None) -> str | None:
    """Where run artifacts go for a SQLite store: ``<db dir>/artifacts``; None for a server."""
    db = sqlite_path(uri or tracking_uri())
    if db is None:
        return None
    return str(db.parent / ARTIFACTS_DIRNAME)


def _init_sqlite(uri: str, db: Path) -> None:
    """Create or migrate the schema, switch to WAL, create the Default experiment (under lock)."""
    import sqlalchemy
    from mlflow.store.db import utils as db_utils
    from mlflow.store.model_registry.sqlalchemy_store import SqlAlchemyStore as RegistryStore
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore as TrackingStore

    engine = sqlalchemy.create_engine(uri)
    try:
        with engine.connect() as conn:
            # WAL is a property of the database file: set once, every later connection uses it.
            conn.exec_driver_sql("PRAGMA journal_mode=WAL")
        if not db_utils._all_tables_exist(engine):
            db_utils._initialize_tables(engine)
        elif db_utils._get_schema_version(engine) != db_utils._get_latest_schema_revision():
            db_utils._upgrade_db(engine)
    finally:
        engine.dispose()
    # Constructing the stores verifies the schema and creates experiment 0 with our artifact root
    # (otherwise it would point at ./mlruns of whatever directory the first client ran in).
    ts = TrackingStore(uri, artifact_root(uri))
    ts.engine.dispose()
    rs = RegistryStore(uri)
    rs.engine.dispose()


def ensure_store() -> str:
    """Make the tracking store ready and point MLflow at it; return the tracking URI.

    For SQLite: creates the parent directory, then creates/migrates the database exactly once
    under ``<db>.lock`` (safe with many processes starting together). Idempotent and cheap after
    the first call in a process. Also sets ``MLFLOW_DISABLE_TELEMETRY=true``.
    """
    os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    uri = tracking_uri()
    import mlflow

    if uri not in _READY:
        db = sqlite_path(uri)
        if db is not None:
            from filelock import FileLock

            db.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(str(db) + ".lock", timeout=300):
                _init_sqlite(uri, db)
        _READY.add(uri)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return uri


def get_or_create_experiment(name: str) -> str:
    """Experiment id for `name`, creating it with its artifacts under the store's artifact root.

    Use this (or :func:`start_run`) instead of ``mlflow.set_experiment``: MLflow's own default
    puts the artifacts of new experiments under ``./mlruns`` of the current directory.
    """
    ensure_store()
    import mlflow
    from mlflow.exceptions import MlflowException

    client = mlflow.MlflowClient()
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    root = artifact_root()
    location = None
    if root is not None:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
        location = Path(root, safe).as_uri()
    try:
        return client.create_experiment(name, artifact_location=location)
    except MlflowException:  # created concurrently by another process
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


@contextlib.contextmanager
def start_run(experiment: str, run_name: str | None = None, tags: dict | None = None,
              **kwargs) -> Iterator["object"]:
    """``mlflow.start_run`` in `experiment` of the TCL store, tagged with ``git_commit`` and
    ``host_cpu`` (this host's CPU model: the same seed gives the same model bit for bit only on
    the same CPU, docs/pipeline.md)."""
    from .hardware import local_cpu_model

    exp_id = get_or_create_experiment(experiment)
    import mlflow

    all_tags = {"git_commit": git_commit(), "host_cpu": local_cpu_model()}
    all_tags.update(tags or {})
    with mlflow.start_run(experiment_id=exp_id, run_name=run_name, tags=all_tags, **kwargs) as run:
        yield run


def git_commit(cwd: str | os.PathLike | None = None) -> str:
    """HEAD's sha, with ``+dirty`` when tracked files differ from HEAD; ``unknown`` outside git.

    Untracked files do not count as dirty (data and outputs are usually untracked).
    """
    root = str(cwd or repo_root())
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=30)
        if sha.returncode != 0:
            return "unknown"
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                cwd=root, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    out = sha.stdout.strip()
    if not out:
        return "unknown"
    if status.returncode != 0 or status.stdout.strip():
        out += "+dirty"
    return out


def _md5_file(path: Path) -> str:
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _dvc_lock_md5(path: Path, root: Path, use_deps: bool = True) -> str | None:
    lock = root / "dvc.lock"
    if not lock.is_file():
        return None
    try:
        rel = path.resolve().relative_to(root).as_posix()
    except ValueError:
        return None
    import yaml

    try:
        data = yaml.safe_load(lock.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    found = None
    for stage in (data.get("stages") or {}).values():
        # an out is authoritative (the stage produced it); a dep records the same md5
        for key in ("outs", "deps") if use_deps else ("outs",):
            for entry in stage.get(key) or []:
                if str(entry.get("path", "")).rstrip("/") == rel and entry.get("md5"):
                    if key == "outs":
                        return str(entry["md5"])
                    found = found or str(entry["md5"])
    return found


def data_hash(path: str | os.PathLike) -> str:
    """A content hash identifying a data file or directory.

    If ``dvc.lock`` (at the repo root) records `path` as an out of a stage (a directory: also
    as a dep), the md5 DVC recorded there is returned (for a directory it ends in ``.dir``), so
    the hash matches what ``dvc status`` tracks. Otherwise the md5 of the file's bytes (equal to
    DVC 3's md5 of the file); for a directory without a dvc.lock entry, the md5 of the sorted
    lines ``<relative path> <md5>`` of its files.
    """
    p = Path(path)
    root = repo_root(p.resolve().parent if p.exists() else None)
    # a deps entry is only rewritten when its stage runs, so while `dvc repro` re-runs a stage it
    # still holds the previous md5: for a file, hash the bytes instead (DVC 3's md5 of a file)
    recorded = _dvc_lock_md5(p, root, use_deps=p.is_dir())
    if recorded:
        return recorded
    if p.is_dir():
        lines = [f"{f.relative_to(p).as_posix()} {_md5_file(f)}"
                 for f in sorted(p.rglob("*")) if f.is_file()]
        return hashlib.md5("\n".join(lines).encode(), usedforsecurity=False).hexdigest()
    return _md5_file(p)
