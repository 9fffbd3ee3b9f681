"""onnxruntime sessions for TCL's models: CPU session options and TCL's fused operators.

Shared by the exporter (its parity check runs the graph the server will run) and the server.
No torch here.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_THREADS = 2
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
