"""A trained model refuses features it was not trained on (width, featurizer version, vocabulary)
with an error naming the file, in `tcl evaluate`, `tcl sample --model` and `tcl transfer`, instead
of a torch shape error or, worse, scores of meaningless inputs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from click.testing import CliRunner

from tcl.features import FeatureKindError, FeatureSet
from tcl.models import new_model

from .test_training import F, make_fs

MAMBA = {"d_model": 8, "n_layers": 1, "d_state": 4, "expand": 1, "d_conv": 2}


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    """An (untrained) Mamba saved as make_fs's features would make it: version test-1, width F."""
    fs = make_fs(seed=1)
    model = new_model("mamba", F, MAMBA, {**fs.meta, "platforms": [fs.platform]})
    path = tmp_path_factory.mktemp("model") / "model.pt"
    model.save(path)
    return model, path


def _variant(fs: FeatureSet, **meta) -> FeatureSet:
    return dataclasses.replace(fs, meta={**fs.meta, **meta})


def _wider(fs: FeatureSet) -> FeatureSet:
    x = np.concatenate([fs.x, np.zeros(fs.x.shape[:2] + (1,), np.float32)], axis=2)
    return dataclasses.replace(fs, x=x, meta={**fs.meta, "n_features": F + 1})


def test_check_features_names_what_differs(saved_model):
    model, _ = saved_model
    fs = make_fs(seed=2)
    model.check_features(fs)  # the same kind, width and version: accepted
    model.check_features(_variant(fs, feature_version=""))  # a side that records no version: not compared
    with pytest.raises(FeatureKindError, match=r"f\.npz: .*features per step; the model reads"):
        model.check_features(_wider(fs), "f.npz")
    with pytest.raises(FeatureKindError, match="version 'test-2'; the model was trained on 'test-1'"):
        model.check_features(_variant(fs, feature_version="test-2"))
    vocab_model = new_model("mamba", F, MAMBA, {**fs.meta, "vocab_hash": "aaa"})
    vocab_model.check_features(_variant(fs, vocab_hash="aaa"))
    with pytest.raises(FeatureKindError, match="vocab_hash mismatch"):
        vocab_model.check_features(_variant(fs, vocab_hash="bbb"))


def test_the_clis_refuse_features_of_another_version_naming_the_file(saved_model, tmp_path):
    from tcl.cli import main

    _, model_path = saved_model
    other = tmp_path / "other-version.npz"
    _variant(make_fs(seed=2), feature_version="test-2").save(other)
    wide = tmp_path / "wider.npz"
    _wider(make_fs(seed=2)).save(wide)
    runner = CliRunner()
    for data in (other, wide):
        res = runner.invoke(main, ["evaluate", "--model", str(model_path), "--data", str(data)])
        assert res.exit_code != 0 and str(data) in res.output and "Traceback" not in res.output, res.output
        res = runner.invoke(main, ["sample", str(data), "--ratio", "0.1", "--strategy", "rdu", "--model",
                                   str(model_path), "--out", str(tmp_path / "subset.npz")])
        assert res.exit_code != 0 and "the model cannot score these programs" in res.output, res.output
        assert not (tmp_path / "subset.npz").exists()
    res = runner.invoke(main, ["sample", str(other), "--set", "ratio=abc", "--out", str(tmp_path / "s.npz")])
    assert res.exit_code != 0 and "must be a number" in res.output and "Traceback" not in res.output, res.output


def test_transfer_refuses_target_data_of_another_version_before_any_training(saved_model, tmp_path):
    from tcl.continual.schedule import ContinualError, transfer

    _, model_path = saved_model
    other = tmp_path / "target.npz"
    _variant(make_fs(seed=3, platform="x86-sse-t2"), feature_version="test-2").save(other)
    with pytest.raises(ContinualError, match=f"{other}: features of version 'test-2'"):
        transfer(model_path, "x86-sse", other, {}, tmp_path / "out", sources=[], track=False)
    empty = tmp_path / "empty.npz"
    fs = make_fs(seed=3, platform="x86-sse-t2")
    fs.subset(np.zeros(0, np.int64)).save(empty)
    with pytest.raises(ContinualError, match="no programs to learn from"):
        transfer(model_path, "x86-sse", empty, {}, tmp_path / "out2", sources=[], track=False)
    assert not (tmp_path / "out" / "model.pt").exists()
