"""onnxruntime sessions for TCL's models: CPU session options and TCL's fused operators; the
thread pools the server and the tuner's trace library run their halves and blocks on.

Shared by the exporter (its parity check runs the graph the server will run) and the server.
No torch here.
"""

from __future__ import annotations

import itertools
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

DEFAULT_THREADS = 2
BIND_ENV = "TCL_BIND_THREADS"  # "0": leave the pools' threads to the OS scheduler
OPT_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC",
              "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


class FusedOpsUnavailable(RuntimeError):
    """Fused operators were demanded but TCL's onnxruntime operator library is not built."""


def session_options(threads: int = DEFAULT_THREADS, opt_level: str = "all", spin: bool = False):
    """onnxruntime CPU session options. Spinning is off by default: idle pool threads that spin
    steal the cores from TVM measurements running beside the tuner (and measured slower here
    whenever the cores are shared)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = int(threads)
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, OPT_LEVELS[opt_level])
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    so.log_severity_level = 3
    return so


def fuse_ops(model: bytes, fused: bool | None) -> tuple[bytes, Path | None, int]:
    """(model bytes to load, operator library to register or None, number of nodes fused)."""
    from tcl.models.mamba_onnx import fuse_selective_scan, fused_library

    if fused is False:
        return model, None, 0
    library = fused_library()
    if library is None:
        if fused:
            raise FusedOpsUnavailable("fused=True but TCL's onnxruntime operator library is not "
                                      "built (reinstall tcl with a C++ compiler present: pip install -e .)")
        return model, None, 0
    import onnx

    proto = onnx.load_from_string(model)
    n = fuse_selective_scan(proto)
    if not n:
        return model, None, 0
    return proto.SerializeToString(), library, n


def inference_session(model: bytes, threads: int = DEFAULT_THREADS, opt_level: str = "all",
                      spin: bool = False, library: Path | None = None):
    """A CPU InferenceSession of `model`, with TCL's operator `library` registered when given."""
    import onnxruntime as ort

    so = session_options(threads, opt_level, spin)
    if library is not None:
        so.register_custom_ops_library(str(library))
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def bound_cpus(n: int) -> list[int] | None:
    """The CPUs `n` pool threads are bound to, one each, spread over the CPUs this process may
    use; None where they are left to the OS scheduler: fewer allowed CPUs than threads, one
    thread, no sched_setaffinity (not Linux), or TCL_BIND_THREADS=0."""
    if n < 2 or os.environ.get(BIND_ENV, "1") == "0" or not hasattr(os, "sched_setaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < n:
        return None
    return [allowed[i * len(allowed) // n] for i in range(n)]


def worker_pool(n: int, name: str) -> ThreadPoolExecutor:
    """A pool of `n` threads, each bound to its own CPU (`bound_cpus`).

    Why: inside tuning, the cost model's work comes in bursts of a few milliseconds between the
    search's own steps. The OS woke both pool threads on the CPU of the thread that woke them,
    and they took turns there while the other core idled (perf, conv2d tuning on the 2-core
    host: the second core idle through 34-44 % of the scoring and trace reading; docs/tuning.md).
    Every process binds its pools the same way: several processes on one machine should each get
    their own CPUs (taskset; the pools spread over those) or set TCL_BIND_THREADS=0.
    """
    cpus = bound_cpus(n)
    if cpus is None:
        return ThreadPoolExecutor(n, thread_name_prefix=name)
    order = itertools.count()  # next() is atomic under the GIL

    def bind() -> None:
        try:
            os.sched_setaffinity(0, {cpus[next(order) % n]})  # 0: the calling thread
        except OSError:  # a CPU taken away since: stay where the OS puts us
            pass

    return ThreadPoolExecutor(n, thread_name_prefix=name, initializer=bind)
