"""How long `moeless plan --slo-tpot-ms` takes, against a baseline commit, measured in one run.

    .venv/bin/python benchmarks/plan_speed.py                       # both cases, baseline 1e57f72
    .venv/bin/python benchmarks/plan_speed.py --cases deepseek --baseline none

Each case runs as a user runs it (the `moeless` command in a subprocess, wall-clock), with this
checkout's code and with the baseline's (a `git worktree` of that commit, its code on PYTHONPATH,
the same venv), on the same data; the chosen plans' figures are compared. Needs ../shared/data.
Writes benchmarks/results/plan_speed.md.

Cases:
* ``deepseek``: DeepSeek-V3 (routing skew from OLMoE's c4 loads), 1,200 s of the Azure 2023
  conversation trace at 0.05 requests/s, chunks of 256, p99 TPOT <= 2,400 ms.
* ``gptoss``: gpt-oss-20b (its own recorded loads), long prompts: Poisson arrivals at 0.5
  requests/s for 120 s, 12,000-token prompts and 200-token answers, p99 TPOT <= 3,000 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import REPO, SHARED, md_header, md_row, write_result

BASELINE = "1e57f72"  # the last commit before the sizing package (issue 37)
GOALS_S = {"deepseek": 90.0, "gptoss": 60.0}  # issue 37: a plan in a minute (or a minute and a half)
CASES = {
    "deepseek": [
        "--policy", "moeless", "--slo-tpot-ms", "2400", "--loads", "{shared}/routing/olmoe_c4.json",
        "--model", "deepseek-v3", "--resample-experts", "--arrivals", "{shared}/arrivals/azure2023_conv.csv",
        "--rate", "0.05", "--duration", "1200", "--prefill-chunk", "256",
    ],
    "gptoss": [
        "--policy", "moeless", "--slo-tpot-ms", "3000",
        "--loads", "{shared}/routing/gptoss20b_decode.loads.json", "--model", "gpt-oss-20b",
        "--arrival", "poisson:0.5", "--duration", "120", "--prompt-tokens", "12000", "--output-tokens", "200",
        "--prefill-chunk", "256",
    ],
}  # fmt: skip


def run_plan(args: list[str], out: Path, tree: Path | None) -> dict[str, Any]:
    """One `moeless plan` with this checkout's code, or (``tree``) a baseline worktree's: its wall
    time, exit code, last line and the plan's figures."""
    env = dict(os.environ)
    command = [sys.executable, "-c", "import sys; from cli.main import cli; sys.exit(cli())"]
    if tree is not None:  # the baseline's code first on the path; its CLI lived in the engine
        env["PYTHONPATH"] = str(tree)
        command = [sys.executable, "-c", "import sys; from moeless.cli.main import cli; sys.exit(cli())"]
    start = time.perf_counter()
    done = subprocess.run(
        [*command, "plan", *args, "-o", str(out)], env=env, capture_output=True, text=True, cwd=tree or REPO
    )
    seconds = time.perf_counter() - start
    said = done.stdout if done.returncode == 0 else done.stderr  # a refusal is its answer too
    lines = [line.strip() for line in said.splitlines() if line.strip() and "%|" not in line]
    figures = {}
    if out.is_file():
        sizing = json.loads(out.read_text())["params"]["sizing"]
        figures = {key: sizing[key] for key in ("memory_mb", "replica_scale", "packing", "every_level")}
        figures |= {k: sizing["planned"][k] for k in ("usd_per_1k_requests", "tpot_ms_p99", "cold_starts")}
    return {
        "seconds": seconds,
        "exit": done.returncode,
        "said": lines[-1] if lines else "",
        "figures": figures,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--baseline", default=BASELINE, help="commit to compare with, or none")
    args = parser.parse_args()
    if not SHARED.is_dir():
        sys.exit(f"needs {SHARED} (the project's shared data)")
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        base_tree = None
        if args.baseline != "none":
            base_tree = Path(scratch) / "baseline"
            add = ["git", "-C", str(REPO), "worktree", "add", "--detach", str(base_tree), args.baseline]
            subprocess.run(add, check=True, capture_output=True)
        try:
            for name in args.cases.split(","):
                case = [a.format(shared=SHARED) for a in CASES[name]]
                print(f"{name}: this checkout ...", flush=True)
                now = run_plan(case, Path(scratch) / f"{name}.json", None)
                then = None
                if base_tree is not None:
                    print(f"{name}: baseline {args.baseline} ...", flush=True)
                    then = run_plan(case, Path(scratch) / f"{name}.base.json", base_tree)
                rows.append((name, now, then))
        finally:
            if base_tree is not None:
                subprocess.run(
                    ["git", "-C", str(REPO), "worktree", "remove", "--force", str(base_tree)], check=False
                )
    lines = [
        "Cases (the module docstring): "
        + "; ".join(f"`{name}`: `moeless plan {' '.join(CASES[name])}`" for name in CASES).replace(
            "{shared}", "../shared/data"
        ),
        "",
        *md_header(("case", "this checkout, s", "goal, s", "baseline, s", "speed-up", "same plan",
                    "this checkout says"), "lrrrrll"),
    ]  # fmt: skip
    for name, now, then in rows:
        base_s = f"{then['seconds']:.0f}" if then else "-"
        ratio = f"{then['seconds'] / now['seconds']:.2f}x" if then else "-"
        same = (
            "-"
            if then is None
            else ("yes" if then["figures"] == now["figures"] else f"no: {then['figures']}")
        )
        goal = f"{GOALS_S[name]:.0f} ({'met' if now['seconds'] <= GOALS_S[name] else 'not met'})"
        lines.append(md_row((name, f"{now['seconds']:.0f}", goal, base_s, ratio, same, now["said"])))
    print("\n".join(lines))
    title = "how long `moeless plan --slo-tpot-ms` takes"
    write_result("plan_speed", title, lines, ["--cases", args.cases, "--baseline", args.baseline])


if __name__ == "__main__":
    main()
