"""The `tcl` command: a thin click layer over the stage modules.

Each area adds its commands from its own module; heavy libraries (torch, tvm, mlflow) are
imported inside the commands so `tcl --help` stays fast.
"""

from __future__ import annotations

import importlib

import click


@click.group()
@click.version_option(package_name="tcl")
def main() -> None:
    """TCL: transferable cost models for tensor programs."""


# area module -> names of the click commands/groups it defines
_AREAS = {
    "tcl.cli.data": ["ingest", "featurize", "split", "collect", "hardware", "dataset"],
    "tcl.cli.models": ["train", "evaluate", "summarize", "bench"],
    "tcl.cli.lifecycle": ["export", "register", "promote", "models", "predict"],
    "tcl.cli.sampling": ["sample"],
    "tcl.cli.continual": ["transfer", "ckd", "ckd_study"],
    "tcl.cli.tuning": ["tune"],
}

for _module_name, _names in _AREAS.items():
    try:
        _module = importlib.import_module(_module_name)
    except ModuleNotFoundError as exc:  # an area not written yet must not break the others
        if exc.name != _module_name:
            raise
        continue
    for _name in _names:
        if hasattr(_module, _name):
            main.add_command(getattr(_module, _name))
