"""onnxruntime session options shared by every place that runs experts (the function, the
in-process fallback, the packager's check), so that many sessions in one process do not fight
over the cores."""

from __future__ import annotations

from typing import Any


def session_options(threads: int = 1) -> Any:
    """onnxruntime options for many sessions in one process: fixed threads, no spinning."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options
