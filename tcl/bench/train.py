"""Training throughput of each cost model on this machine (`tcl bench train`).

One short timed run per model on the same data (a FeatureSet, or random tensors of the same
shape), after one untimed warm-up batch:

* nets (mamba-kb, mamba-ac, mlp, tlp): forward + LambdaRank loss + backward + Adam step over
  `n_samples` programs in batches of `train.batch_size`; samples/s = programs per second, i.e. how
  fast one epoch goes.
* xgb: a fit of a few boosting rounds over the same programs, extrapolated to the configured
  `n_estimators`; samples/s = programs / seconds for one complete fit, the comparable quantity
  (a boosted model sees its data once per fit, a net once per epoch).
"""

from __future__ import annotations

import os
import time

import numpy as np

MODELS = ("mamba-kb", "mamba-ac", "mlp", "tlp", "xgb")
DEFAULT_PARAMS = {
    "models": {
        "mamba": {"kb": {"d_model": 64, "n_layers": 1, "d_state": 8, "expand": 1, "d_conv": 4},
                  "ac": {"d_model": 128, "n_layers": 2, "d_state": 16, "expand": 2, "d_conv": 4}},
        "mlp": {"hidden": 256, "n_layers": 3},
        "tlp": {"d_model": 128, "n_heads": 4, "n_layers": 2},
        "xgb": {"n_estimators": 200, "max_depth": 8, "eta": 0.2},
    },
    "train": {"batch_size": 1024, "lr": 7e-4},
    "featurize": {"max_len": 48},
}


class _Arrays:
    """The four arrays of a FeatureSet that training touches."""

    def __init__(self, x, mask, y, task, platform="synthetic"):
        self.x, self.mask, self.y, self.task, self.platform = x, mask, y, task, platform

    def __len__(self):
        return len(self.y)


def synthetic(n: int, max_len: int, n_features: int, programs_per_task: int = 64, seed: int = 0) -> _Arrays:
    """Random programs with realistic shapes: variable lengths, labels in (0, 1] per task."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, max_len, n_features)).astype(np.float32)
    lengths = rng.integers(max_len // 3, max_len + 1, size=n)
    mask = np.arange(max_len)[None, :] < lengths[:, None]
    x *= mask[..., None]
    task = (np.arange(n) // programs_per_task).astype(np.int32)
    lat = rng.lognormal(0.0, 0.5, size=n)
    best = np.full(task.max() + 1, np.inf)
    np.minimum.at(best, task, lat)
    y = (best[task] / lat).astype(np.float32)
    return _Arrays(x, mask, y, task)


def _subset(fs, n: int) -> _Arrays:
    n = min(n, len(fs))
    return _Arrays(np.asarray(fs.x[:n]), np.asarray(fs.mask[:n]), np.asarray(fs.y[:n]),
                   np.asarray(fs.task[:n]), getattr(fs, "platform", "?"))


def _config(name: str, params: dict) -> tuple[str, dict]:
    from tcl.models import model_config, parse_model_name

    kind, preset = parse_model_name(name)
    models = {**DEFAULT_PARAMS["models"], **(params.get("models") or {})}
    return kind, model_config(kind, {"models": models}, preset)


def _bench_net(kind: str, config: dict, data: _Arrays, batch_size: int, lr: float, threads: int,
               device: str = "cpu", scan: str = "auto") -> dict:
    import torch

    from tcl.losses import lambdarank_loss
    from tcl.models import new_model
    from tcl.training import tune_malloc

    torch.set_num_threads(threads)
    tune_malloc()
    torch.manual_seed(0)
    model = new_model(kind, data.x.shape[2], config).net.to(device)
    if scan != "auto" and hasattr(model, "set_scan_method"):
        model.set_scan_method(scan)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    n_params = sum(p.numel() for p in model.parameters())
    batches = []
    for a in range(0, len(data), batch_size):
        sl = slice(a, a + batch_size)
        batches.append(tuple(torch.from_numpy(arr).to(device) for arr in
                             (data.x[sl], data.mask[sl], data.y[sl], data.task[sl].astype(np.int64))))

    def sync():  # CUDA runs asynchronously: wait for the queued kernels before reading the clock
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)

    def step(x, m, y, t):
        loss = lambdarank_loss(model(x, m), y, t)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    model.train()
    step(*batches[0])  # warm-up: allocator, kernels
    sync()
    t0 = time.perf_counter()
    for b in batches:
        step(*b)
    sync()
    seconds = time.perf_counter() - t0
    return {"samples_per_s": len(data) / seconds, "seconds": seconds, "n_params": int(n_params),
            "size_mb": n_params * 4 / 2**20}


def _bench_xgb(config: dict, data: _Arrays, threads: int, rounds: int = 10) -> dict:
    from tcl.models.xgb import XGBModel

    full = int(config.get("n_estimators", 200))
    rounds = max(1, min(rounds, full))
    model = XGBModel(data.x.shape[2], config={**config, "n_estimators": rounds}, n_threads=threads)
    t0 = time.perf_counter()
    model.boost([data])
    seconds = (time.perf_counter() - t0) * full / rounds
    return {"samples_per_s": len(data) / seconds, "seconds": seconds, "n_params": None, "size_mb": None}


def bench_train(names=MODELS, fs=None, n_samples: int = 4096, params: dict | None = None,
                n_features: int | None = None, threads: int = 2, device: str = "cpu",
                scan: str | tuple[str, ...] = "auto") -> list[dict]:
    """One row per model: {model, kind, samples_per_s, seconds, n_params, size_mb, n_samples, shape,
    device}. `device` is a torch device for the nets ("cuda" on a GPU); xgb always runs on the CPU. `scan`
    forces the Mamba scan method (tcl.models.mamba: fused, fast, ref, cuda, ...; auto = the block's
    choice); several (a tuple) give a Mamba model one row each, with `speedup` over the first."""
    scans = (scan,) if isinstance(scan, str) else tuple(scan)
    from tcl.models import model_class
    from tcl.models.nets import NetCostModel

    params = params or {}
    train = {**DEFAULT_PARAMS["train"], **(params.get("train") or {})}
    max_len = int((params.get("featurize") or {}).get("max_len", DEFAULT_PARAMS["featurize"]["max_len"]))
    if fs is None and n_features is None:
        from tcl.features import Featurizer

        n_features = Featurizer(max_len).n_features  # the real featurizer's width
    data = _subset(fs, n_samples) if fs is not None else synthetic(n_samples, max_len, n_features)
    rows = []
    for name in names:
        if name not in MODELS:
            raise ValueError(f"unknown model {name!r}; choose from {MODELS}")
        kind, config = _config(name, params)
        is_net = issubclass(model_class(kind), NetCostModel)
        first = None
        for method in scans if kind == "mamba" else scans[:1]:
            if is_net:
                r = _bench_net(kind, config, data, int(train["batch_size"]), float(train["lr"]), threads,
                               device, method)
            else:  # boosted trees: rounds, not epochs, timed as one full fit
                r = _bench_xgb(config, data, threads)
            first = first or r["seconds"]
            rows.append({"model": name, "kind": kind, "n_samples": len(data),
                         "shape": list(data.x.shape[1:]), "threads": threads,
                         "device": str(device) if is_net else "cpu", "scan": method if kind == "mamba" else None,
                         **r, "speedup": first / r["seconds"] if kind == "mamba" and len(scans) > 1 else None,
                         "loadavg": os.getloadavg()[0]})  # other load on the cores skews the numbers
    return rows


def format_table(rows: list[dict]) -> str:
    head = f"{'model':10s} {'scan':6s} {'samples/s':>11s} {'seconds':>9s} {'params':>10s} {'MB':>7s} {'vs first scan':>13s}"
    lines = [head, "-" * len(head)]
    for r in rows:
        params = f"{r['n_params']:,d}" if r.get("n_params") is not None else "-"
        size = f"{r['size_mb']:.2f}" if r.get("size_mb") is not None else "-"
        ratio = f"{r['speedup']:.2f}x" if r.get("speedup") is not None else "-"
        lines.append(f"{r['model']:10s} {r.get('scan') or '-':6s} {r['samples_per_s']:11.0f} {r['seconds']:9.2f} "
                     f"{params:>10s} {size:>7s} {ratio:>13s}")
    if rows:
        lines.append(f"({rows[0]['n_samples']} programs of shape {tuple(rows[0]['shape'])}, "
                     f"{rows[0]['threads']} threads, nets on {rows[0]['device']}, load average {max(r['loadavg'] for r in rows):.2f}; "
                     "xgb: one full fit of n_estimators rounds, nets: one epoch)")
    return "\n".join(lines)
