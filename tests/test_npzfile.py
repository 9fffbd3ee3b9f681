"""Uncompressed .npz files read row by row and written chunk by chunk (tcl.npzfile), and the
feature sets `tcl sample` reads that way."""

from __future__ import annotations

import numpy as np
import pytest

from tcl.features import FeatureSet, load_feature_set
from tcl.npzfile import StoredRows, stored_rows, write_npz
from tests.test_training import make_fs


@pytest.fixture
def stored(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(500, 6, 5)).astype(np.float32)
    mask = rng.random((500, 6)) < 0.5
    path = tmp_path / "a.npz"
    np.savez(path, x=x, mask=mask, name=np.asarray("pool"))
    return path, x, mask


def test_stored_rows_read_what_np_load_reads(stored):
    path, x, mask = stored
    rows = stored_rows(path, "x")
    assert isinstance(rows, StoredRows) and rows.shape == x.shape and rows.dtype == x.dtype and len(rows) == 500
    rng = np.random.default_rng(1)
    for key in (slice(None), slice(10, 20), slice(490, 600), slice(0, 50, 7), rng.integers(0, 500, 300),
                np.array([499, 0, 0, 250, 251, 252, -1]), rng.random(500) < 0.2, []):
        assert np.array_equal(rows[key], x[key]), key
    assert np.array_equal(rows[7], x[7]) and np.array_equal(rows[-2], x[-2])
    assert np.array_equal(rows[3:9, 2], x[3:9, 2]) and np.array_equal(rows[3, 2], x[3, 2])
    assert np.array_equal(rows[[4, 1], :, 0], x[[4, 1], :, 0])
    assert np.array_equal(stored_rows(path, "mask")[[5, 1]], mask[[5, 1]])
    with pytest.raises(IndexError):
        rows[[500]]


def test_a_view_of_stored_rows_reads_nothing_until_indexed(stored):
    path, x, _ = stored
    index = np.random.default_rng(2).permutation(500)[:120]
    view = stored_rows(path, "x").take(index)
    assert view.shape == (120, 6, 5)
    assert np.array_equal(np.asarray(view), x[index])
    assert np.array_equal(view[10:30], x[index][10:30])
    assert np.array_equal(view.take(slice(5, 9))[:], x[index][5:9])


def test_members_that_cannot_be_read_in_place_say_so(stored, tmp_path):
    path, x, _ = stored
    assert stored_rows(path, "name") is None                   # 0-d: loaded whole
    packed = tmp_path / "packed.npz"
    np.savez_compressed(packed, x=x)
    assert stored_rows(packed, "x") is None                   # compressed: loaded whole
    with pytest.raises(KeyError):
        stored_rows(path, "y")
    # a file cut short: the read names the file
    cut = tmp_path / "cut.npz"
    cut.write_bytes(path.read_bytes())
    rows = stored_rows(cut, "x")
    with open(cut, "r+b") as f:
        f.truncate(rows.offset + 100 * rows.row_bytes)
    with pytest.raises(ValueError, match="cut.npz: truncated"):
        rows[90:110]


def test_write_npz_streams_stored_rows_into_a_file_np_load_reads(stored, tmp_path, monkeypatch):
    import tcl.npzfile

    monkeypatch.setattr(tcl.npzfile, "CHUNK_ROWS", 7)          # several chunks, the last one short
    path, x, mask = stored
    index = np.random.default_rng(3).permutation(500)[:101]
    out = tmp_path / "b.npz"
    with open(out, "wb") as f:
        write_npz(f, {"x": stored_rows(path, "x").take(index), "mask": mask[index], "name": np.asarray("sub")})
    with np.load(out, allow_pickle=False) as z:
        assert np.array_equal(z["x"], x[index]) and np.array_equal(z["mask"], mask[index]) and str(z["name"]) == "sub"
    assert np.array_equal(stored_rows(out, "x")[:], x[index])  # and in place again


def test_a_feature_set_with_stored_steps_subsets_and_saves_as_one_in_memory(tmp_path):
    path = tmp_path / "train.npz"
    fs = make_fs(n_tasks=5, per_task=20, seed=4)
    fs.save(path)
    lazy = load_feature_set(path, stored_x=True)
    assert isinstance(lazy.x, StoredRows) and np.array_equal(lazy.x[:], fs.x)
    index = np.random.default_rng(5).permutation(len(fs))[:37]
    a, b = tmp_path / "a.npz", tmp_path / "b.npz"
    fs.subset(index).save(a)
    lazy.subset(index).save(b)
    assert isinstance(lazy.subset(index).x, StoredRows)
    ea, eb = FeatureSet.load(a), FeatureSet.load(b)
    assert np.array_equal(ea.x, eb.x) and np.array_equal(ea.mask, eb.mask)
    assert np.array_equal(ea.y, eb.y) and ea.tasks == eb.tasks and list(ea.program_id) == list(eb.program_id)
