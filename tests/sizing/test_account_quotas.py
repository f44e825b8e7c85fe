"""The optimiser within the account's quotas: structures and warmth the account cannot hold are
left out unjudged and counted, memory above the cap is never tried, and where nothing fits the
refusal names the quota and the smallest increase that admits a candidate."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from cli.main import cli
from moeless.contracts.loads import Loads
from moeless.errors import PlanDoesNotFit
from moeless.planning.quotas import CONCURRENCY_QUOTA, MEMORY_QUOTA, quota_shortfalls
from moeless.simulation.policies import Deployment
from moeless.simulation.routing import SampledRouting
from moeless.simulation.simulator import Request
from moeless.sizing import SearchSpace, Slo, SloUnreachable, size_for_slo
from moeless.sizing.report import left_out_lines
from tests.sizing.test_sizing import one_expert_shape

# Lambda alone: these tests are about the functions (the tiers: tests/sizing/test_tiers.py)
BARE = SearchSpace(
    stall_bound=False, every_level_premium=None, processes=1, host_shares=(), alternatives=False
)


def wide(experts: int) -> tuple[Deployment, SampledRouting]:
    """One MoE layer of ``experts`` with even loads: the planner gives each one replica."""
    deployment = Deployment.choose(replace(one_expert_shape(), num_experts=experts))
    routing = SampledRouting.from_loads(Loads({0: np.ones(experts)}, {"top_k": 1}), 1, [0], 1)
    return deployment, routing


def test_structures_beyond_the_account_are_left_out_and_counted():
    # GIVEN 64 experts: replicas x1 invoke 64 environments at once, x4 256; an account of 200 and
    # a new account's 3,008 MB functions (the default sizes are 1,769 and 3,538 MB)
    deployment, routing = wide(64)
    replay = [Request(10.0 * n, 4, 4, n) for n in range(4)]
    search = replace(BARE, account_concurrency=200, max_function_memory_mb=3008)
    sizing = size_for_slo("moeless", deployment, routing, replay, 60.0, Slo(1e6), search)
    # THEN only x1 at 1,769 MB is judged, and every plan judged fits
    assert {(p.replica_scale, p.memory_mb) for p in sizing.points} == {(1, 1769)}
    assert all(quota_shortfalls(p.plan, search.quotas) == [] for p in sizing.points)
    short = {s.quota: s for needs in sizing.left_out for s in needs}
    assert (short[CONCURRENCY_QUOTA].needed, short[MEMORY_QUOTA].needed) == (256, 3538)
    assert left_out_lines(sizing) == [
        "  4 candidates left out: they need more than the account's 200 concurrent executions "
        "(the least by 56)",
        "  4 candidates left out: their functions need more than the account's 3,008 MB (the least by 530)",
    ]


def test_warmth_beyond_the_account_is_left_out_and_the_refusal_says_so():
    # GIVEN a TTFT bound only a warm function 0 meets, and an account of 100: Lambda keeps all 100
    # unreserved, so nothing may be kept warm
    deployment = Deployment.choose(one_expert_shape())
    routing = SampledRouting.from_loads(Loads({0: np.array([1.0, 0, 0, 0])}, {"top_k": 1}), 1, [0], 1)
    replay = [Request(400.0 * n, 1, 4, n) for n in range(4)]
    cold_ms = deployment.model.cold_start_ms(deployment.expert_size().weight_bytes)
    search = replace(BARE, account_concurrency=100, replica_scales=(1,), packings=(1,))
    with pytest.raises(SloUnreachable, match=r"were not judged.*L-B99A9384.*ask for 1 more") as caught:
        size_for_slo("moeless", deployment, routing, replay, 1600.0, Slo(1e6, ttft_ms=cold_ms / 2), search)
    sizing = caught.value.sizing
    assert sizing.left_out and all(not p.plan.functions[0].keep_warm for p in sizing.points)
    # WHEN the account has one more, THEN function 0 is kept warm
    roomier = replace(search, account_concurrency=101)
    chosen = size_for_slo(
        "moeless", deployment, routing, replay, 1600.0, Slo(1e6, ttft_ms=cold_ms / 2), roomier
    ).chosen
    assert chosen is not None and chosen.keep_warm + chosen.provisioned == 1


@pytest.mark.parametrize(
    ("quotas", "says"),
    [
        pytest.param(
            {"account_concurrency": 50}, r"L-B99A9384.*the account has 50 .*ask for 50 more", id="concurrency"
        ),
        pytest.param(
            {"max_function_memory_mb": 1024},
            r"Lambda function memory: the plan needs 1,769, the account has 1,024 .*ask for 745 more",
            id="memory",
        ),
    ],
)
def test_where_no_candidate_fits_the_refusal_names_the_smallest_increase(quotas, says):
    deployment, routing = wide(4)
    replay = [Request(0.0, 4, 4, 0)]
    with pytest.raises(PlanDoesNotFit, match=says):
        size_for_slo("moeless", deployment, routing, replay, 60.0, Slo(1e6), replace(BARE, **quotas))


MIXTRAL = {"model": "mistralai/Mixtral-8x7B-v0.1", "top_k": 2, "num_model_layers": 32,
           "layers": [{"layer": 0, "counts": [50, 30, 10, 5, 3, 1, 1, 0]}]}  # fmt: skip


@pytest.fixture
def sized_args(tmp_path) -> list[str]:
    """``plan --slo-tpot-ms`` on Mixtral, one request, one structure per memory size."""
    (tmp_path / "loads.json").write_text(json.dumps(MIXTRAL))
    (tmp_path / "arrivals.csv").write_text("timestamp_s,input_tokens,output_tokens\n0,20,3\n")
    search = {"replica_scales": [1], "packings": [1], "stall_bound": False, "every_level_premium": None,
              "processes": 1, "host_shares": [], "alternatives": False}  # fmt: skip
    (tmp_path / "search.json").write_text(json.dumps(search))
    return ["plan", "--loads", str(tmp_path / "loads.json"), "--policy", "moeless", "--slo-tpot-ms", "1e7",
            "--arrivals", str(tmp_path / "arrivals.csv"), "--duration", "60", "--search",
            str(tmp_path / "search.json"), "-o", str(tmp_path / "plan.json")]  # fmt: skip


def test_sized_plan_says_what_the_account_left_out(sized_args):
    result = CliRunner().invoke(cli, [*sized_args, "--max-function-memory-mb", "3008"])
    assert result.exit_code == 0, result.output
    assert "1 candidate left out: its functions need more than the account's 3,008 MB" in result.output


def test_sized_plan_that_no_account_of_the_size_holds_is_refused(sized_args):
    result = CliRunner().invoke(cli, [*sized_args, "--account-concurrency", "50"])
    assert result.exit_code == 1 and not Path(sized_args[-1]).exists()
    assert "L-B99A9384" in result.output and "ask for 50 more" in result.output
