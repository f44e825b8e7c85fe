"""The main job as a user meets it, and what holds under shutdown, faults and overload:
``moeless demo`` end to end and on Ctrl-C, ``moeless serve`` on SIGTERM with a request in flight,
and a short run of the soak script (benchmarks/soak.py) with every fault injected."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
MOELESS = str(Path(sys.executable).with_name("moeless"))


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _all_gone(processes: list[psutil.Process], timeout_s: float = 20) -> list[psutil.Process]:
    _gone, alive = psutil.wait_procs(processes, timeout=timeout_s)
    return alive


def test_serve_finishes_the_request_in_flight_on_sigterm_and_stops_every_process(tiny):
    artifacts = tiny.package("mixtral")
    process = subprocess.Popen(
        [MOELESS, "serve", str(artifacts), "--local", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = process.stdout.readline()
        assert line.startswith("REST endpoint: http://127.0.0.1:"), line + process.stderr.read()
        url = line.split()[2].removesuffix("/v1")
        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        result: dict = {}

        def long_request() -> None:
            body = {"model": model, "prompt": "The import statement", "max_tokens": 48, "temperature": 0}
            result["response"] = httpx.post(f"{url}/v1/completions", json=body, timeout=120)

        thread = threading.Thread(target=long_request)
        thread.start()
        deadline = time.monotonic() + 60
        while "moeless_expert_invokes_total" not in _nonzero_metrics(url) and time.monotonic() < deadline:
            time.sleep(0.05)
        children = _descendants(process.pid)
        assert children, "the local host should be running function instances"
        process.send_signal(signal.SIGTERM)
        thread.join(timeout=120)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=90)
    response = result["response"]
    # finished (uvicorn drains in-flight requests) or failed explicitly, never a dropped connection
    if response.status_code == 200:
        assert response.json()["choices"][0]["finish_reason"] in ("length", "stop")
    else:
        assert response.status_code == 503 and "shut down" in response.json()["error"]["message"]
    assert process.returncode == 0, err
    assert "bill (what AWS Lambda would charge)" in out
    assert not _all_gone(children), "function instances outlived the service"


def _nonzero_metrics(url: str) -> str:
    try:
        text = httpx.get(f"{url}/metrics", timeout=5).text
    except httpx.HTTPError:
        return ""
    return "\n".join(
        line for line in text.splitlines() if not line.startswith("#") and not line.endswith(" 0.0")
    )


@pytest.mark.slow
def test_soak_short_run_with_every_fault_has_no_failures(tmp_path):
    out = tmp_path / "soak.json"
    run = subprocess.run(
        [
            sys.executable,
            "benchmarks/soak.py",
            "--clients",
            "3",
            "--seconds",
            "10",
            "--kill-every",
            "1",
            "--burst",
            "24",
            "--max-waiting",
            "2",
            "--json",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["failures"] == 0 and result["outcome"]["ok"] == result["requests"] > 0
    assert result["faults"]["instances_killed"] >= 1
    assert result["service"]["invoke_errors"] > 0 and result["service"]["fallbacks"] > 0
    assert result["overload"]["rejected_with_retry_after"] > 0


def _quick_demo(tmp_path: Path) -> list[str]:
    """The demo on a 20-step model and only its own prompts (what a fresh clone has)."""
    workdir, no_prompts = tmp_path / "demo", tmp_path / "none.jsonl"
    return [MOELESS, "demo", "--workdir", str(workdir), "--train-steps", "20", "--prompts", str(no_prompts)]


@pytest.mark.slow
def test_demo_end_to_end_then_a_rerun_reuses_everything(tmp_path):
    command = [*_quick_demo(tmp_path), "--quiet"]
    first = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:] + first.stdout[-3000:]
    for section in (
        "## Answers",
        "## Predicted vs actual experts",
        "## Plans (served: moeless)",
        "## The local Lambda host's bill",
        "## Simulated cost and latency",
    ):
        assert section in first.stdout, section
    assert "split system = unsplit model on 16/16 prompts" in first.stdout
    assert "moeless sized for p99 TPOT <=" in first.stdout  # the plan served is the optimiser's
    # served with its trained draft's speculation
    assert "tokens per sequence per decode forward" in first.stdout
    assert (tmp_path / "demo" / "report" / "demo.md").is_file()
    assert list((tmp_path / "demo" / "report").glob("*.png"))
    again = subprocess.run(command[:-1], capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "reusing the trace" in again.stderr and "training:" not in again.stderr


@pytest.mark.slow
def test_demo_cleans_up_every_process_on_ctrl_c(tmp_path):
    process = subprocess.Popen(
        _quick_demo(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    children: list[psutil.Process] = []
    try:
        for line in process.stderr:
            if " functions on http://" in line:  # serving: the host's instances and the server are up
                children = _descendants(process.pid)
                break
        assert children, "the demo never reached serving: " + process.stdout.read()[-2000:]
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode != 0, f"the demo went on after Ctrl-C:\n{err[-3000:]}\n{out[-1500:]}"
    assert not _all_gone(children), "processes outlived the demo after Ctrl-C"
