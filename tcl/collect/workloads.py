"""TE definitions of the operators in `networks.py`, as TIR IRModules MetaSchedule can tune."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from .networks import Op, Task, network_tasks


def build_workload(op: Op):
    """Return the TIR IRModule (one PrimFunc, `main`) computing `op` in float32."""
    from tvm import te, topi

    kind, shape = op.kind, op.shape
    if kind == "conv2d":
        h, cin, cout, k, stride = shape
        data = te.placeholder((1, h, h, cin), name="data")
        kernel = te.placeholder((k, k, cin, cout), name="kernel")
        out = topi.nn.conv2d_nhwc(data, kernel, stride, k // 2, 1, out_dtype="float32")
        args = [data, kernel, out]
    elif kind == "depthwise_conv2d":
        h, c, k, stride = shape
        data = te.placeholder((1, h, h, c), name="data")
        kernel = te.placeholder((k, k, c, 1), name="kernel")
        out = topi.nn.depthwise_conv2d_nhwc(data, kernel, stride, k // 2, 1, out_dtype="float32")
        args = [data, kernel, out]
    elif kind == "dense":
        m, k, n = shape
        data = te.placeholder((m, k), name="data")
        weight = te.placeholder((n, k), name="weight")
        out = topi.nn.dense(data, weight, out_dtype="float32")
        args = [data, weight, out]
    elif kind == "batch_matmul":
        b, m, k, n = shape
        a = te.placeholder((b, m, k), name="a")
        bt = te.placeholder((b, n, k), name="b")
        out = topi.nn.batch_matmul(a, bt, transpose_b=True, out_dtype="float32")
        args = [a, bt, out]
    elif kind == "softmax":
        rows, cols = shape
        x = te.placeholder((rows, cols), name="x")
        out = topi.nn.softmax(x, axis=-1)
        args = [x, out]
    elif kind == "layer_norm":
        rows, cols = shape
        x = te.placeholder((rows, cols), name="x")
        gamma = te.placeholder((cols,), name="gamma")
        beta = te.placeholder((cols,), name="beta")
        out = topi.nn.layer_norm(x, gamma, beta, axis=[-1], epsilon=1e-5)
        args = [x, gamma, beta, out]
    else:
        raise ValueError(f"unknown operator kind {kind!r}")
    import tvm

    func = te.create_prim_func(args).with_attr("global_symbol", "main")
    return tvm.IRModule({"main": func})


def describe(op: Op) -> str:
    """Readable operator + shapes, e.g. 'conv2d NHWC 1x56x56x64 k3 s1 -> 64'."""
    s = op.shape
    if op.kind == "conv2d":
        return f"conv2d NHWC 1x{s[0]}x{s[0]}x{s[1]} k{s[3]}x{s[3]} s{s[4]} -> {s[2]} ch"
    if op.kind == "depthwise_conv2d":
        return f"depthwise_conv2d NHWC 1x{s[0]}x{s[0]}x{s[1]} k{s[2]}x{s[2]} s{s[3]}"
    if op.kind == "dense":
        return f"dense {s[0]}x{s[1]} · ({s[2]}x{s[1]})ᵀ"
    if op.kind == "batch_matmul":
        return f"batch_matmul {s[0]}x{s[1]}x{s[2]} · ({s[0]}x{s[3]}x{s[2]})ᵀ"
    return f"{op.kind} {s[0]}x{s[1]}"


# Small workloads for tests and smoke runs (`tcl collect --workload NAME`); network tasks are
# accepted by their task name too (e.g. dense_128_768_768).
SMALL_WORKLOADS = {
    "dense_64": Op("dense", (64, 64, 64)),
    "dense_256": Op("dense", (256, 256, 256)),
    "conv2d_small": Op("conv2d", (14, 32, 32, 3, 1)),
    "softmax_small": Op("softmax", (64, 128)),
}


# The dimensions of each operator kind, in `Op.shape` (and so task-name) order: `KIND_D1_..._DN`
# names an operator of any shape, e.g. dense_512_1024_256 (build_workload reads them in this order)
SHAPE_DIMS = {
    "conv2d": ("H", "CIN", "COUT", "K", "STRIDE"),   # NHWC 1xHxHxCIN, KxK kernel, 'same' padding
    "depthwise_conv2d": ("H", "C", "K", "STRIDE"),
    "dense": ("M", "K", "N"),                         # (M, K) x (N, K)^T
    "batch_matmul": ("B", "M", "K", "N"),             # (B, M, K) x (B, N, K)^T
    "softmax": ("ROWS", "COLS"),
    "layer_norm": ("ROWS", "COLS"),
}
SHAPE_FORMS = ", ".join(f"{kind}_{'_'.join(dims)}" for kind, dims in SHAPE_DIMS.items())


def parse_shape_name(name: str) -> Op | None:
    """The Op a `KIND_D1_..._DN` name spells (None when it starts with no known kind); KeyError
    saying what is wrong when the dimensions are not the kind's count of positive integers."""
    kind = max((k for k in SHAPE_DIMS if name.startswith(k + "_")), key=len, default=None)
    if kind is None:
        return None
    dims, parts = SHAPE_DIMS[kind], name[len(kind) + 1:].split("_")
    form = f"{kind}_{'_'.join(dims)}"
    if len(parts) != len(dims) or not all(p.isascii() and p.isdigit() and int(p) > 0 for p in parts):
        raise KeyError(f"workload {name!r}: {kind} takes {len(dims)} positive integer dimensions, "
                       f"{form} (got {'_'.join(parts)!r})")
    return Op(kind, tuple(int(p) for p in parts))


def resolve_workload(name: str) -> Op:
    """A small workload's, a network task's, or a `KIND_D1_..._DN` name's operator."""
    if name in SMALL_WORKLOADS:
        return SMALL_WORKLOADS[name]
    tasks = network_tasks()
    if name in tasks:
        return tasks[name].op
    op = parse_shape_name(name)
    if op is not None:
        return op
    raise KeyError(
        f"unknown workload {name!r}; use one of {', '.join(SMALL_WORKLOADS)}, a network task name "
        f"(`tcl collect --list-tasks` prints them) or an operator by its shape: {SHAPE_FORMS}"
    )


def task_module(task: Task):
    """The TIR IRModule of `task`: a database workload's own, else built from its operator."""
    return task.mod if task.mod is not None else build_workload(task.op)


def task_description(task: Task) -> str:
    return describe(task.op) if task.op is not None else task.desc


def task_kind(task: Task) -> str:
    """The operator kind; ``workload`` for a database's workload (any TIR)."""
    return task.op.kind if task.op is not None else "workload"


@dataclass(frozen=True)
class DatabaseWorkload:
    """One workload of a MetaSchedule database, with what tasks.json beside it says of it."""

    name: str     # tasks.json's name, else the structural hash (as `tcl ingest` names its records)
    mod: object   # tvm.IRModule
    desc: str = ""
    weight: float = 1.0
    weights: dict = field(default_factory=dict)  # network -> occurrences

    def task(self) -> Task:
        return Task(self.name, None, dict(self.weights), mod=self.mod, desc=self.desc)


def database_workloads(db_path: str | os.PathLike, index: int | None = None) -> list[DatabaseWorkload]:
    """The workloads of a MetaSchedule database (its folder or its database_workload.json), or
    the one at line `index` (0-based); names, weights and descriptions from tasks.json beside it.
    ValueError naming the file (and line) for a bad file."""
    from tvm.s_tir import meta_schedule as ms

    from tcl.records.metaschedule import _existing, _lines

    path = Path(db_path)
    wl_path = path if path.is_file() else _existing(path / "database_workload.json")
    meta_path = wl_path.parent / "tasks.json"
    try:
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    except ValueError as exc:  # json's decode error names no file
        raise ValueError(f"{meta_path}: not a tasks.json ({exc})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{meta_path}: not a tasks.json (a JSON object by workload hash expected)")
    found = []
    for lineno, line in enumerate(_lines(wl_path), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            workload = ms.database.Workload.from_json(entry)
        except Exception as exc:  # noqa: BLE001 - TVM raises several kinds for a bad module
            raise ValueError(f"{wl_path}:{lineno}: not a MetaSchedule workload ({str(exc)[:120]})") from None
        info = meta.get(str(entry[0]), {})
        # unnamed, a workload is its structural hash, as `tcl ingest` names it: a positional name
        # would give different workloads of two databases one task in the records made of them
        found.append(DatabaseWorkload(info.get("name", str(entry[0])), workload.mod, info.get("desc", ""),
                                      float(info.get("weight", 1.0)), dict(info.get("weights", {}))))
    if index is not None:
        if not 0 <= index < len(found):
            raise ValueError(f"{wl_path}: --task-index {index} out of range (it holds {len(found)} workloads)")
        found = [found[index]]
    if not found:
        raise ValueError(f"{wl_path}: no workload in it")
    return found
