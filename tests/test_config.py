"""The one params.yaml loader: clear errors naming the file, and the repository fallback."""

from __future__ import annotations

import pytest
import yaml

from tests.conftest import REPO


def test_load_params_reads_the_file_and_names_bad_ones(tmp_path, monkeypatch):
    from tcl.config import ParamsError, load_params

    good = tmp_path / "p.yaml"
    good.write_text("train:\n  lr: 0.01\n")
    assert load_params(good) == {"train": {"lr": 0.01}}
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_params(empty) == {}
    listed = tmp_path / "list.yaml"
    listed.write_text("- a\n- b\n")
    with pytest.raises(ParamsError, match=r"list\.yaml: params must be a mapping"):
        load_params(listed)
    broken = tmp_path / "broken.yaml"
    broken.write_text("train: [1, 2\n")
    with pytest.raises(ParamsError, match=r"broken\.yaml: cannot read params"):
        load_params(broken)
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ParamsError, match="cannot read params file .*missing.yaml: No such file or directory"):
        load_params(missing)
    assert load_params(missing, required=False) == {}


def test_a_relative_path_missing_here_falls_back_to_the_repository(tmp_path, monkeypatch):
    from tcl.config import load_params

    monkeypatch.chdir(tmp_path)
    assert load_params("params.yaml") == yaml.safe_load((REPO / "params.yaml").read_text())
