"""The search space's defaults in one place, the plan command a user drives (every option that does
not apply refused, its help on one screen), traffic that judges nothing refused, and judging in
order of a bound changing no choice."""

from __future__ import annotations

import ast
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from cli.cmd_plan import ANALYTIC_ONLY, SIZED_ONLY
from cli.main import cli
from moeless.contracts.loads import Loads
from moeless.simulation.policies import Deployment
from moeless.simulation.routing import SampledRouting
from moeless.simulation.simulator import PolicyResult, Request
from moeless.sizing import DEFAULT_SEARCH, Slo, size_for_slo
from moeless.sizing.settings import SearchFileError, load_search
from tests.sizing.test_sizing import one_expert_shape

REPO = Path(__file__).resolve().parents[2]
MIXTRAL = {"model": "mistralai/Mixtral-8x7B-v0.1", "top_k": 2, "num_model_layers": 32,
           "layers": [{"layer": 0, "counts": [50, 30, 10, 5, 3, 1, 1, 0]}]}  # fmt: skip
# options that apply both with and without --slo-tpot-ms
BOTH = {"loads_path", "policy", "model_spec", "slo_tpot_ms", "output", "print_search", "account_concurrency",
        "max_function_memory_mb"}  # fmt: skip
# a value each option takes when given (flags: none)
VALUES = {
    "slo_ttft_ms": "100", "search_path": "SEARCH", "arrivals_path": "ARRIVALS", "arrival": "poisson:1",
    "rate": "1", "duration": "60", "prompt_tokens": "8", "output_tokens": "4", "seed": "1",
    "max_batch": "4", "prefill_chunk": "8", "context_tokens": "512", "expert_dtype": "fp16",
    "gpu_dtype": "bf16", "instances_path": "ARRIVALS", "workers": "2", "slots": "4", "memory_gb": "2",
    "slo_ms": "50", "artifacts": "DIR", "previous": "ARRIVALS", "top_k": "2", "batch_tokens": "8",
    "steps_per_s": "2", "speculate": "1", "draft_acceptance_text": "0.8",
}  # fmt: skip


@pytest.fixture
def files(tmp_path):
    loads = tmp_path / "loads.json"
    loads.write_text(json.dumps(MIXTRAL))
    arrivals = tmp_path / "arrivals.csv"
    arrivals.write_text("timestamp_s,input_tokens,output_tokens\n0,20,3\n")
    search = tmp_path / "search.json"
    search.write_text("{}")
    return {
        "LOADS": loads,
        "ARRIVALS": arrivals,
        "SEARCH": search,
        "DIR": tmp_path,
        "OUT": tmp_path / "p.json",
    }


def plan_options() -> dict[str, list[str]]:
    """Every option of ``plan`` by its name: the flag to give it with."""
    from cli.cmd_plan import plan

    return {p.name: list(p.opts) for p in plan.params if p.name}  # type: ignore[misc]


def test_every_plan_option_is_placed_in_one_way_of_planning_or_both():
    names = set(plan_options())
    assert names == BOTH | set(SIZED_ONLY) | set(ANALYTIC_ONLY)
    assert not set(SIZED_ONLY) & set(ANALYTIC_ONLY)


@pytest.mark.parametrize("name", sorted(set(SIZED_ONLY) | set(ANALYTIC_ONLY)))
def test_an_option_given_where_it_does_not_apply_is_refused_naming_it(files, name):
    """Each option is given in the way of planning it does not belong to (and, for a sized-only
    one, with the other options it needs): exit 2 and one line naming it."""
    flag = plan_options()[name][-1]
    value = VALUES.get(name)
    given = [flag] + ([str(files.get(value, value))] if value is not None else [])
    base = ["plan", "--loads", str(files["LOADS"]), "--policy", "moeless", "-o", str(files["OUT"])]
    mode = ["--slo-tpot-ms", "1000"] if name in ANALYTIC_ONLY else []
    result = CliRunner().invoke(cli, [*base, *mode, *given])
    assert result.exit_code == 2, result.output
    assert flag in result.output.splitlines()[-1] and not files["OUT"].exists()


@pytest.mark.parametrize(
    ("given", "says"),
    [
        (["--rate", "1"], "--rate rescales --arrivals, which is not given"),
        (["--arrivals", "ARRIVALS", "--prompt-tokens", "9"], "--prompt-tokens not with --arrivals"),
        (["--policy", "static"], "--policy static with --slo-tpot-ms"),
    ],
)
def test_sized_options_that_need_another_are_refused(files, given, says):
    args = [str(files.get(a, a)) for a in given]
    base = ["plan", "--loads", str(files["LOADS"]), "--slo-tpot-ms", "9", "-o", str(files["OUT"])]
    policy = [] if "--policy" in given else ["--policy", "moeless"]
    result = CliRunner().invoke(cli, [*base, *policy, *args])
    assert result.exit_code == 2 and says in result.output


def test_analytic_options_of_another_policy_are_refused(files):
    base = ["plan", "--loads", str(files["LOADS"]), "-o", str(files["OUT"])]
    result = CliRunner().invoke(cli, [*base, "--policy", "moeless", "--slo-ms", "50"])
    assert result.exit_code == 2 and "--slo-ms applies to --policy remoe only" in result.output


def test_plan_help_fits_one_screen():
    result = CliRunner().invoke(cli, ["plan", "--help"], terminal_width=80)
    assert result.exit_code == 0 and len(result.output.splitlines()) <= 50


def test_the_defaults_are_the_search_spaces_and_a_search_file_changes_them(files, tmp_path):
    printed = CliRunner().invoke(cli, ["plan", "--print-search"])
    assert printed.exit_code == 0 and json.loads(printed.output) == json.loads(DEFAULT_SEARCH.to_json())
    written = tmp_path / "defaults.json"
    written.write_text(printed.output)
    assert load_search(written) == DEFAULT_SEARCH  # the printed file reads back as the defaults
    written.write_text(json.dumps({"packings": [2], "stall_bound": False}))
    assert load_search(written) == replace(DEFAULT_SEARCH, packings=(2,), stall_bound=False)
    refusals = (
        ({"packings": 2}, "packings is a list"),
        ({"stall_bound": 1}, "true or false"),
        ({"packings": [0]}, "positive integers"),
        ({"nope": 1}, "unknown setting(s) nope"),
    )
    for bad, says in refusals:
        written.write_text(json.dumps(bad))
        with pytest.raises(SearchFileError, match=says.replace("(", r"\(").replace(")", r"\)")):
            load_search(written)


def test_the_cli_and_the_demo_size_with_the_default_search_space(monkeypatch, files):
    import moeless.sizing as sizing

    seen = []

    def spy(*args, **kwargs):
        seen.append(args[6] if len(args) > 6 else kwargs.get("search", DEFAULT_SEARCH))
        raise SystemExit(0)

    monkeypatch.setattr(sizing, "size_for_slo", spy)
    args = ["plan", "--loads", str(files["LOADS"]), "--policy", "moeless", "--slo-tpot-ms", "9", "--arrivals",
            str(files["ARRIVALS"]), "-o", str(files["OUT"])]  # fmt: skip
    CliRunner().invoke(cli, args)
    assert seen == [DEFAULT_SEARCH]
    assert "DEFAULT_SEARCH" in (REPO / "moeless/demo/steps.py").read_text()


def test_the_accounts_quotas_come_from_the_search_file_unless_the_command_line_gives_them(
    monkeypatch, files, tmp_path
):
    import moeless.sizing as sizing

    seen = []

    def spy(*args, **kwargs):
        seen.append(args[6])
        raise SystemExit(0)

    monkeypatch.setattr(sizing, "size_for_slo", spy)
    search = tmp_path / "quotas.json"
    search.write_text(json.dumps({"account_concurrency": 300, "max_function_memory_mb": 3008}))
    assert load_search(search).quotas == replace(DEFAULT_SEARCH, account_concurrency=300,
                                                 max_function_memory_mb=3008).quotas  # fmt: skip
    args = ["plan", "--loads", str(files["LOADS"]), "--policy", "moeless", "--slo-tpot-ms", "9", "--arrivals",
            str(files["ARRIVALS"]), "--search", str(search), "-o", str(files["OUT"])]  # fmt: skip
    CliRunner().invoke(cli, args)
    CliRunner().invoke(cli, [*args, "--account-concurrency", "500"])
    assert [(s.account_concurrency, s.max_function_memory_mb) for s in seen] == [(300, 3008), (500, 3008)]
    search.write_text(json.dumps({"max_function_memory_mb": 20000}))
    with pytest.raises(SearchFileError, match="max_function_memory_mb: Lambda allows 128-10240"):
        load_search(search)


def test_every_benchmark_that_sizes_starts_from_the_default_search_space():
    """A benchmark states what it changes from the defaults, never a default of its own."""
    for path in sorted((REPO / "benchmarks").glob("*.py")):
        tree = ast.parse(path.read_text())
        calls = [
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "size_for_slo"
        ]
        if calls:
            assert "DEFAULT_SEARCH" in path.read_text(), path.name
            assert all(len(call.args) >= 7 for call in calls), f"{path.name}: a search space is passed"


def test_a_window_where_no_request_arrives_is_refused_and_an_empty_percentile_is_none(files):
    args = ["plan", "--loads", str(files["LOADS"]), "--policy", "moeless", "--slo-tpot-ms", "1",
            "--arrival", "poisson:0.0001", "--duration", "1", "-o", str(files["OUT"])]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1 and "too short for this traffic" in result.output
    assert not files["OUT"].exists()
    summary = PolicyResult("moeless", requests=2).summary()
    assert summary["tpot_ms_p99"] is None and summary["ttft_ms_p50"] is None
    assert not Slo(1e9).met(summary | {"completed": 2})
    one_token = [Request(0.0, 4, 1, 0)]
    routing = SampledRouting.from_loads(Loads({0: np.array([1.0, 0, 0, 0])}, {"top_k": 1}), 1, [0], 1)
    with pytest.raises(Exception, match="decodes a second token"):
        size_for_slo("moeless", Deployment.choose(one_expert_shape()), routing, one_token, 10.0, Slo(1.0))


def test_judging_in_order_of_a_bound_in_worker_processes_changes_no_choice():
    """With the defaults (stall bound, insurance), each SLO's plan is the same whether every
    candidate is judged in this process or only those the bound leaves, in two processes."""
    deployment = replace(Deployment.choose(one_expert_shape()), prefill_chunk=256)
    routing = SampledRouting.from_loads(Loads({0: np.array([4.0, 3, 2, 1])}, {"top_k": 1}), 1, [0], 1)
    rng = np.random.default_rng(5)
    arrivals, prompts = np.sort(rng.uniform(0, 900, 8)), rng.integers(64, 1024, 8)
    replay = [Request(float(t), int(p), 6, n) for n, (t, p) in enumerate(zip(arrivals, prompts, strict=True))]
    every = replace(DEFAULT_SEARCH, processes=1, exhaustive=True, memory_mb=(1769,))
    frontier = size_for_slo("moeless", deployment, routing, replay, 1200.0, Slo(1e9), every)
    # each SLO one point meets, itself and its structure's stall probe
    bounds = sorted({max(p.summary["tpot_ms_p99"], p.stall_tpot_ms) for p in frontier.points if p.finished})
    pruned_search = replace(every, processes=2, exhaustive=False)
    judged = []
    for bound in bounds[:: max(1, len(bounds) // 3)]:
        all_of_them = size_for_slo("moeless", deployment, routing, replay, 1200.0, Slo(bound), every)
        pruned = size_for_slo("moeless", deployment, routing, replay, 1200.0, Slo(bound), pruned_search)
        assert pruned.chosen.plan == all_of_them.chosen.plan
        assert pruned.chosen.usd_per_1k == all_of_them.chosen.usd_per_1k
        assert pruned.simulated + pruned.skipped == all_of_them.simulated and all_of_them.skipped == 0
        judged.append(pruned.skipped)
    assert judged
