"""The registered knowledge-base (KB) model of each hardware family, in the MLflow model registry.

* One registered model per family: ``tcl-kb-<family>``. Each version is an MLflow ``onnx``-flavour
  logged model (``model.onnx`` + the PyTorch checkpoint as an extra file) logged to the run that
  trained it, so lineage reads run -> logged model -> model version.
* Every version carries tags: family, platforms, git_commit, data_hash, run_id, feature_version,
  top1, top5, eval_data_hash, checkpoint_sha256, onnx_sha256, kind, host_cpu (the training run's
  host CPU: training is reproducible bit for bit on one CPU model, not across). A new version gets the alias
  ``candidate``.
* :func:`promote` moves an alias (``production`` by default). It refuses a version whose held-out
  top-1 is below the current holder's *on the same evaluation data* (equal eval_data_hash) unless
  forced. Read-check-set runs under a per-family file lock and the alias is re-read afterwards,
  so two racing promotions serialise: each sees the other's result.
* Registering the same checkpoint again (same checkpoint sha256 and same run) returns the
  existing version; nothing new is logged.

MLflow is imported lazily.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tcl import tracking
from tcl.io import file_sha256

PREFIX = "tcl-kb-"
MODEL_URI = re.compile(r"^models:/([^/@]+)(?:@([^/]+)|/([^/]+))$")  # models:/<name>@<alias> or /<version>
REGISTRY_EXPERIMENT = "tcl-registry"
_FAMILY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
VERSION_TAGS = ("family", "platforms", "git_commit", "data_hash", "run_id", "feature_version",
                "top1", "top5", "eval_data_hash", "checkpoint_sha256", "onnx_sha256", "kind", "host_cpu")
PIP_REQUIREMENTS = ["onnxruntime", "onnx", "numpy"]


class TclRegistryError(Exception):
    """A registry operation that cannot proceed; the CLI prints the message (exit code 2)."""


class PromotionRefused(TclRegistryError):
    """Promotion gated: lower held-out top-1 than the current holder on the same eval data."""


def model_name(family: str) -> str:
    if not isinstance(family, str) or not _FAMILY_RE.match(family):
        raise TclRegistryError(f"invalid hardware family name {family!r} "
                               "(letters, digits, '-', '_', '.')")
    return PREFIX + family


def _defaults() -> dict:
    """registry section of params.yaml (alias_new, alias_serve)."""
    from tcl.config import ParamsError, load_params

    try:
        return dict(load_params(tracking.repo_root() / "params.yaml", required=False).get("registry") or {})
    except ParamsError:
        return {}


def alias_new() -> str:
    return str(_defaults().get("alias_new", "candidate"))


def alias_serve() -> str:
    return str(_defaults().get("alias_serve", "production"))


def _lock(family: str):
    """A file lock serialising registry writes of one family (across processes on this host)."""
    from filelock import FileLock

    uri = tracking.tracking_uri()
    db = tracking.sqlite_path(uri)
    if db is not None:
        d = db.parent / "locks"
    else:
        d = Path(tempfile.gettempdir()) / ("tcl-registry-" + hashlib.md5(
            uri.encode(), usedforsecurity=False).hexdigest()[:12])
    d.mkdir(parents=True, exist_ok=True)
    return FileLock(str(d / f"{model_name(family)}.lock"), timeout=600)


def _client():
    tracking.ensure_store()
    import mlflow

    return mlflow.MlflowClient()


def _versions(client, name: str) -> list:
    return list(client.search_model_versions(f"name='{name}'"))


def _registered(client, name: str) -> bool:
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
        return True
    except MlflowException:
        return False


def _families(client) -> list[str]:
    return sorted(m.name[len(PREFIX):] for m in
                  client.search_registered_models(filter_string=f"name LIKE '{PREFIX}%'"))


def _float(s: Any) -> float:
    try:
        return float(s)
    except (TypeError, ValueError):
        return math.nan


def _version_dict(client, mv) -> dict:
    name = mv.name
    try:  # search results may not carry aliases on every store; the single get does
        aliases = list(client.get_model_version(name, mv.version).aliases or [])
    except Exception:  # noqa: BLE001
        aliases = list(getattr(mv, "aliases", []) or [])
    tags = dict(mv.tags or {})
    return {
        "name": name,
        "family": tags.get("family", name[len(PREFIX):]),
        "version": int(mv.version),
        "aliases": sorted(aliases),
        "tags": tags,
        "top1": _float(tags.get("top1")),
        "top5": _float(tags.get("top5")),
        "run_id": mv.run_id or tags.get("run_id"),
        "source": mv.source,
        "status": mv.status,
        "created": _dt.datetime.fromtimestamp(mv.creation_timestamp / 1000,
                                              _dt.timezone.utc).isoformat(timespec="seconds"),
    }


def _get_version(client, family: str, version_or_alias: str | int):
    """The ModelVersion for a version number or alias; TclRegistryError if unknown."""
    from mlflow.exceptions import MlflowException

    name = model_name(family)
    if not _registered(client, name):
        known = ", ".join(_families(client)) or "none"
        raise TclRegistryError(f"unknown family {family!r}: no registered model {name} "
                               f"(registered families: {known})")
    ref = str(version_or_alias).strip()
    try:
        if ref.isdigit():
            return client.get_model_version(name, ref)
        return client.get_model_version_by_alias(name, ref)
    except MlflowException:
        versions = sorted(int(v.version) for v in _versions(client, name))
        what = "version" if ref.isdigit() else "alias"
        hint = ""
        if ref == alias_serve() and _alias_holder(client, name, alias_new()) is not None:
            hint = (f"; a new KB waits at @{alias_new()}: promote it with `tcl promote {family} "
                    f"{alias_new()}` or use models:/{name}@{alias_new()}")
        raise TclRegistryError(f"{name} has no {what} {ref!r} "
                               f"(versions: {', '.join(map(str, versions)) or 'none'}){hint}") from None


def _alias_holder(client, name: str, alias: str):
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException:
        return None


def register_kb(checkpoint_path: str | os.PathLike, family: str, platforms: list[str] | str,
                run_id: str | None, eval_metrics: dict, eval_data_hash: str, data_hash: str,
                onnx_path: str | os.PathLike | None = None, alias: str | None = None,
                tags: dict[str, str] | None = None) -> int:
    """Log the KB checkpoint + its ONNX export to `run_id` and register it as ``tcl-kb-<family>``
    with `alias` (default: params ``registry.alias_new``, i.e. ``candidate``).

    Returns the version number. When `onnx_path` is None the checkpoint is exported here. When
    `run_id` is None a run is created in the ``tcl-registry`` experiment. Registering a checkpoint
    that is already registered (same sha256, same run when `run_id` is given, and the same ONNX
    file when `onnx_path` is given) returns the existing version and logs nothing; a new export
    of a registered checkpoint (a newer exporter, say) becomes a new version. `tags`: more version
    tags (e.g. a transfer's sources, target and subset hash); they cannot replace the ones above.
    """
    ckpt = Path(checkpoint_path)
    if not ckpt.is_file():
        raise TclRegistryError(f"checkpoint not found: {ckpt}")
    name = model_name(family)
    if isinstance(platforms, str):
        platforms = [p for p in (s.strip() for s in platforms.split(",")) if p]
    platforms = list(platforms)
    if not platforms:
        raise TclRegistryError("platforms must name at least one platform")
    try:
        top1 = float(eval_metrics["top1"])
        top5 = float(eval_metrics["top5"])
    except (KeyError, TypeError, ValueError):
        raise TclRegistryError("eval_metrics must hold numeric 'top1' and 'top5' "
                               f"(got keys {sorted(eval_metrics or {})})") from None
    if not (math.isfinite(top1) and math.isfinite(top5)):
        raise TclRegistryError(f"eval metrics must be finite (top1={top1}, top5={top5})")
    if not eval_data_hash or not data_hash:
        raise TclRegistryError("eval_data_hash and data_hash are required (see tracking.data_hash)")
    extra_tags = {str(k): str(v) for k, v in (tags or {}).items()}  # `tags` is reused below
    clash = sorted(set(extra_tags) & {*VERSION_TAGS, "run_id"})
    if clash:
        raise TclRegistryError(f"extra version tags may not replace TCL's own: {', '.join(clash)}")
    ckpt_sha = file_sha256(ckpt)
    # an existing file is hashed once: it identifies the version below and is tagged with it
    given_onnx_sha = (file_sha256(Path(onnx_path))
                      if onnx_path is not None and Path(onnx_path).is_file() else None)

    client = _client()
    import mlflow
    from mlflow.exceptions import MlflowException

    with _lock(family):
        if _registered(client, name):
            for mv in _versions(client, name):
                tags = mv.tags or {}
                if tags.get("checkpoint_sha256") == ckpt_sha and (
                        run_id is None or tags.get("run_id") == run_id) and (
                        given_onnx_sha is None or tags.get("onnx_sha256") == given_onnx_sha):
                    _repair_alias(client, name, mv)
                    return int(mv.version)
        # the CPU the model was trained on: training is bit-exact on one host, not across hosts
        train_host = "unknown"
        if run_id is not None:
            try:
                train_host = client.get_run(run_id).data.tags.get("host_cpu", train_host)
            except MlflowException:
                raise TclRegistryError(f"run {run_id!r} not found in {tracking.tracking_uri()}") \
                    from None

        import onnx

        from tcl import export as export_mod

        with tempfile.TemporaryDirectory(prefix="tcl-register-") as tmp:
            if onnx_path is None:
                onnx_file = Path(tmp, "model.onnx")
                export_mod.export_onnx(ckpt, onnx_file, family, source_run=run_id)
            else:
                onnx_file = Path(onnx_path)
                if not onnx_file.is_file():
                    raise TclRegistryError(f"ONNX file not found: {onnx_file}")
            meta = export_mod.read_metadata(onnx_file)
            if meta.get("family") != family:
                raise TclRegistryError(f"{onnx_file} was exported for family "
                                       f"{meta.get('family')!r}, not {family!r}")
            if meta.get("checkpoint_sha256") not in (None, "", ckpt_sha):
                raise TclRegistryError(f"{onnx_file} was exported from a different checkpoint "
                                       f"(sha256 {meta['checkpoint_sha256'][:12]} != "
                                       f"{ckpt_sha[:12]}); re-export it")
            onnx_sha = given_onnx_sha if onnx_path is not None else file_sha256(onnx_file)
            model_proto = onnx.load(str(onnx_file))
            ckpt_copy = Path(tmp, "checkpoint.pt")
            shutil.copyfile(ckpt, ckpt_copy)

            tags = {
                "family": family,
                "platforms": ",".join(platforms),
                "git_commit": tracking.git_commit(),
                "data_hash": str(data_hash),
                "feature_version": str(meta.get("feature_version", "")),
                "top1": repr(top1),
                "top5": repr(top5),
                "eval_data_hash": str(eval_data_hash),
                "checkpoint_sha256": ckpt_sha,
                "onnx_sha256": onnx_sha,
                "kind": str(meta.get("kind", "")),
                "host_cpu": train_host,
                **extra_tags,
            }
            created_run = None
            if run_id is None:
                exp_id = tracking.get_or_create_experiment(REGISTRY_EXPERIMENT)
                created_run = client.create_run(exp_id, run_name=f"register-{family}",
                                                tags={"git_commit": tags["git_commit"],
                                                      "family": family})
                run_id = created_run.info.run_id
            tags["run_id"] = run_id
            try:
                # the logged model lives in the run's experiment (log_model alone would put it
                # in the active experiment, i.e. Default, whatever run it is linked to)
                logged = mlflow.initialize_logged_model(
                    name="kb", source_run_id=run_id, tags={"family": family},
                    experiment_id=client.get_run(run_id).info.experiment_id)
                info = mlflow.onnx.log_model(
                    model_proto,
                    name="kb",
                    model_id=logged.model_id,
                    run_id=run_id,
                    pip_requirements=PIP_REQUIREMENTS,
                    onnx_execution_providers=["CPUExecutionProvider"],
                    save_as_external_data=False,
                    extra_files=[str(ckpt_copy)],
                    signature=_signature(int(meta["n_features"])),
                    metadata={"family": family, "feature_version": tags["feature_version"]},
                )
                mv = mlflow.register_model(info.model_uri, name, tags=tags)
                try:
                    client.set_registered_model_alias(name, alias or alias_new(), mv.version)
                    client.set_registered_model_tag(name, "family", family)
                except BaseException:
                    # no version without its alias: undo this one (a killed process cannot; a
                    # rerun repairs that case, see _repair_alias)
                    with contextlib.suppress(Exception):
                        client.delete_model_version(name, mv.version)
                    raise
            finally:
                if created_run is not None:
                    client.set_terminated(run_id)
    return int(mv.version)


def _repair_alias(client, name: str, mv) -> None:
    """Give the newest registration its `candidate` alias when a killed `register` left it without."""
    holder = _alias_holder(client, name, alias_new())
    if holder is None or int(holder.version) < int(mv.version):
        client.set_registered_model_alias(name, alias_new(), mv.version)


def _signature(n_features: int):
    import numpy as np
    from mlflow.models.signature import ModelSignature
    from mlflow.types.schema import Schema, TensorSpec

    inputs = Schema([TensorSpec(np.dtype("float32"), (-1, -1, n_features), "x"),
                     TensorSpec(np.dtype("bool"), (-1, -1), "mask")])
    outputs = Schema([TensorSpec(np.dtype("float32"), (-1,), "score")])
    return ModelSignature(inputs=inputs, outputs=outputs)


def promote(family: str, version: str | int, alias: str | None = None,
            force: bool = False) -> dict:
    """Point `alias` (default: params ``registry.alias_serve``, i.e. ``production``) at `version`.

    Refused (:class:`PromotionRefused`) when the current holder of the alias was evaluated on the
    same data (equal ``eval_data_hash``) and has a higher top-1, unless `force`. Returns a dict
    with status ``promoted`` or ``unchanged``, the previous holder and whether the two were
    comparable.
    """
    alias = alias or alias_serve()
    name = model_name(family)
    client = _client()
    with _lock(family):
        mv = _get_version(client, family, version)
        new_v = int(mv.version)
        new_tags = mv.tags or {}
        prev = _alias_holder(client, name, alias)
        result = {"family": family, "name": name, "alias": alias, "version": new_v,
                  "top1": _float(new_tags.get("top1")), "previous": None,
                  "previous_top1": None, "comparable": None, "forced": bool(force)}
        if prev is not None:
            prev_tags = prev.tags or {}
            result["previous"] = int(prev.version)
            result["previous_top1"] = _float(prev_tags.get("top1"))
            if int(prev.version) == new_v:
                result["status"] = "unchanged"
                return result
            same_data = (bool(prev_tags.get("eval_data_hash"))
                         and prev_tags.get("eval_data_hash") == new_tags.get("eval_data_hash"))
            result["comparable"] = same_data
            lower = not (result["top1"] >= result["previous_top1"])  # NaN counts as lower
            if same_data and lower and not force:
                raise PromotionRefused(
                    f"refused: {name} version {new_v} has top1={result['top1']:.4f}, below "
                    f"{alias} version {prev.version} (top1={result['previous_top1']:.4f}) on the "
                    f"same eval data (eval_data_hash {prev_tags.get('eval_data_hash')}); "
                    f"use --force to promote anyway")
        client.set_registered_model_alias(name, alias, str(new_v))
        client.set_model_version_tag(name, str(new_v), f"promoted_{alias}_at",
                                     _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
        after = _alias_holder(client, name, alias)
        if after is None or int(after.version) != new_v:
            raise TclRegistryError(f"{name}@{alias} changed concurrently: now version "
                                   f"{None if after is None else after.version}, not {new_v}")
        result["status"] = "promoted"
        return result


def list_models(family: str | None = None) -> list[dict]:
    """Every version of every ``tcl-kb-*`` model (or of one family), oldest first."""
    client = _client()
    families = [family] if family else _families(client)
    out = []
    for fam in families:
        name = model_name(fam)
        if not _registered(client, name):
            if family:
                raise TclRegistryError(f"unknown family {family!r}: no registered model {name} "
                                       f"(registered: {', '.join(_families(client)) or 'none'})")
            continue
        out.extend(_version_dict(client, mv) for mv in _versions(client, name))
    out.sort(key=lambda d: (d["family"], d["version"]))
    return out


def show(family: str, version_or_alias: str | int | None = None) -> dict:
    """One version (number or alias; default: the serving alias, else the latest version)."""
    client = _client()
    if version_or_alias is None:
        name = model_name(family)
        holder = _alias_holder(client, name, alias_serve()) if _registered(client, name) else None
        if holder is not None:
            version_or_alias = holder.version
        else:
            mvs = _versions(client, name) if _registered(client, name) else []
            if not mvs:
                _get_version(client, family, alias_serve())  # raises the unknown-family error
            version_or_alias = max(int(v.version) for v in mvs)
    mv = _get_version(client, family, version_or_alias)
    d = _version_dict(client, mv)
    d["model_uri"] = f"models:/{mv.name}/{mv.version}"
    return d


def resolve_onnx(model_uri: str, dst_dir: str | os.PathLike) -> tuple[Path, dict]:
    """Download the ONNX file of ``models:/tcl-kb-<family>@alias`` (or ``/<version>``).

    Returns (path to model.onnx under `dst_dir`, version info dict).
    """
    return _version_file(model_uri, dst_dir, "*.onnx", "no .onnx file")


def default_kb_uri(family: str, hint: str = "give --model") -> tuple[str, str | None]:
    """The family's KB a command uses when none is given: ``models:/tcl-kb-<family>@production``
    (`alias_serve`), else ``@candidate`` (`alias_new`: what the main job registers, before anyone
    promotes it). Returns (URI, None), or (URI, a warning saying the candidate is used) for the
    fallback; TclRegistryError naming `hint` when the family has neither alias."""
    client = _client()
    name = model_name(family)
    registered = _registered(client, name)
    for alias in (alias_serve(), alias_new()):
        holder = _alias_holder(client, name, alias) if registered else None
        if holder is None:
            continue
        if alias == alias_serve():
            return f"models:/{name}@{alias}", None
        return f"models:/{name}@{alias}", (
            f"{name} has no @{alias_serve()} version; using @{alias} (version {holder.version}), not yet "
            f"promoted: `tcl promote {family} {alias}` makes it the served KB")
    # the main job registers the bundled families' KBs; any other family makes its own from one of them
    others = [f for f in _families(client) if f != family]
    make = "the main job (dvc repro) registers the bundled families' KBs"
    if others:
        start = model_name(others[0])
        held = alias_serve() if _alias_holder(client, start, alias_serve()) else alias_new()
        make = (f"registered: {', '.join(model_name(f) for f in others)}; one of them starts this family's own "
                f"(`tcl transfer --family {family} --from models:/{start}@{held} --target-data SUBSET.npz --register`)")
    raise TclRegistryError(f"no registered KB for family {family!r}: {name} has no @{alias_serve()} or "
                           f"@{alias_new()} version ({hint}; {make})")


def kb_checkpoint(ref: str | None, family: str, dst_dir: str | os.PathLike) -> tuple[Path, dict]:
    """The PyTorch checkpoint to continue a family's KB from: `ref` is a checkpoint file or
    training directory, or a ``models:/tcl-kb-<family>@alias`` / ``/<version>`` URI; None means
    the family's registered KB (``@production``, else ``@candidate``). Returns (path, info):
    info is the version's dict (with ``model_uri``) for a registered model, ``{"source": path}``
    for a file."""
    if ref is not None and not str(ref).startswith("models:/"):
        from tcl.models import resolve_model_path

        try:
            return resolve_model_path(ref), {"source": str(ref)}
        except FileNotFoundError as exc:
            raise TclRegistryError(str(exc)) from None
    if ref is None:
        ref, _ = default_kb_uri(family, hint="give --from")
    path, info = _version_file(str(ref), dst_dir, "checkpoint.pt", "no checkpoint.pt")
    info["model_uri"] = str(ref)
    return path, info


def kb_uri_parts(model_uri: str) -> tuple[str, str] | None:
    """(family, alias or version) of ``models:/tcl-kb-<family>@alias`` or ``/<version>``; None for
    any other string (a file, another registered model, a runs:/ URI)."""
    m = MODEL_URI.match(model_uri.strip())
    if not m or not m.group(1).startswith(PREFIX):
        return None
    return m.group(1)[len(PREFIX):], m.group(2) or m.group(3)


def _version_file(model_uri: str, dst_dir: str | os.PathLike, pattern: str, missing: str) -> tuple[Path, dict]:
    """The first file matching `pattern` among the downloaded artifacts of a registered version
    (``models:/tcl-kb-<family>@alias`` or ``/<version>``), and the version's info dict."""
    m = MODEL_URI.match(model_uri.strip())
    if not m:
        raise TclRegistryError(f"not a registry model URI: {model_uri!r} "
                               "(expected models:/tcl-kb-<family>@<alias> or /<version>)")
    name, alias, ver = m.groups()
    if not name.startswith(PREFIX):
        raise TclRegistryError(f"{name!r} is not a TCL KB model (names start with {PREFIX!r})")
    family = name[len(PREFIX):]
    client = _client()
    mv = _get_version(client, family, alias or ver)
    import mlflow

    local = Path(mlflow.artifacts.download_artifacts(
        artifact_uri=f"models:/{name}/{mv.version}", dst_path=str(dst_dir)))
    found = sorted(local.rglob(pattern))
    if not found:
        raise TclRegistryError(f"{name} version {mv.version} has {missing} in {mv.source}")
    return found[0], _version_dict(client, mv)


def dumps(obj: Any, indent: int | None = None) -> str:
    """JSON for CLI output (NaN -> null); one line unless `indent` (a `--json` answer is the
    output's last line, as every command's is)."""
    def clean(o):
        if isinstance(o, float) and not math.isfinite(o):
            return None
        if isinstance(o, dict):
            return {k: clean(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [clean(v) for v in o]
        return o

    return json.dumps(clean(obj), indent=indent, sort_keys=True)
