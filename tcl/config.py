"""The one reader of ``params.yaml``: every stage gets its settings through :func:`load_params`.

A relative path that does not exist in the working directory falls back to the repository's
own file (``tcl.tracking.repo_root``), so commands run from a subdirectory still find it.
Errors name the file and the reason.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_PARAMS = "params.yaml"


class ParamsError(ValueError):
    """params.yaml is missing, unreadable or not a mapping."""


def find_params(path: str | os.PathLike = DEFAULT_PARAMS) -> Path:
    """`path` if it exists (or is absolute), else the repository's file of that name."""
    p = Path(path)
    if p.is_file() or p.is_absolute():
        return p
    from tcl.tracking import repo_root

    for root in (repo_root(), Path(__file__).resolve().parents[1]):
        if (root / p).is_file():
            return root / p
    return p


def load_params(path: str | os.PathLike | None = DEFAULT_PARAMS, required: bool = True) -> dict:
    """params.yaml as a dict. `required=False`: {} when `path` is None or no file is found."""
    import yaml

    if path is None:
        if required:
            raise ParamsError("no params file given")
        return {}
    p = find_params(path)
    if not p.is_file():
        if required:
            raise ParamsError(f"cannot read params file {p}: No such file or directory")
        return {}
    try:
        data = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ParamsError(f"{p}: cannot read params ({exc})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ParamsError(f"{p}: params must be a mapping at the top level, not {type(data).__name__}")
    return data


def tune_settings(name: str, defaults: dict, overrides: dict | None = None) -> dict:
    """`defaults`, then params.yaml ``tune.<name>``, then `overrides`; a key not in `defaults`
    raises (a misspelt setting would otherwise be silently ignored)."""
    section = (load_params(required=False).get("tune") or {}).get(name) or {}
    settings = {**defaults, **section, **(overrides or {})}
    unknown = set(settings) - set(defaults)
    if unknown:
        raise ValueError(f"unknown tune.{name} settings {sorted(unknown)} (known: {sorted(defaults)})")
    return settings
