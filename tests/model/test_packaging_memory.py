"""Packaging reads experts lazily: peak memory grows with one expert, not with the checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BUILD = (
    "import sys; from pathlib import Path; from moeless.model.tiny import TinySpec, build_tiny_model; "
    "build_tiny_model(Path(sys.argv[1]), TinySpec(arch='mixtral', layers={layers}, experts={experts}, "
    "hidden={hidden}, intermediate={inter}))"
)
PACKAGE = (
    "import sys; from pathlib import Path; from moeless.model.packaging import package; "
    "package(Path(sys.argv[1]), Path(sys.argv[2]), progress=False)"
)


def _peak_rss_mb(code: str, *args: str) -> float:
    """Run ``python -c code args`` and return its peak resident memory in MB (from wait4)."""
    proc = subprocess.Popen([sys.executable, "-c", code, *args])
    _, status, usage = os.wait4(proc.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return usage.ru_maxrss / 1024


@pytest.mark.slow
def test_peak_memory_is_independent_of_checkpoint_size(tmp_path: Path):
    # GIVEN a small checkpoint and one whose 64 experts weigh 805 MB (12.6 MB each)
    small, big = tmp_path / "small", tmp_path / "big"
    subprocess.run(
        [sys.executable, "-c", BUILD.format(layers=1, experts=2, hidden=512, inter=2048), small], check=True
    )
    subprocess.run(
        [sys.executable, "-c", BUILD.format(layers=4, experts=16, hidden=512, inter=2048), big], check=True
    )
    expert_mb = 3 * 512 * 2048 * 4 / 1e6
    # WHEN each is packaged in its own process
    small_peak = _peak_rss_mb(PACKAGE, str(small), str(tmp_path / "small-art"))
    big_peak = _peak_rss_mb(PACKAGE, str(big), str(tmp_path / "big-art"))
    # THEN 32x more experts cost less than 5 experts' worth of extra memory (not 805 MB)
    print(
        f"peak RSS: 2 experts {small_peak:.0f} MB, 64 experts {big_peak:.0f} MB; "
        f"one expert {expert_mb:.1f} MB"
    )
    assert big_peak - small_peak < 5 * expert_mb
