"""Drafts per forward as a decision of the optimiser: searched where the deployment has a drafter,
chosen where only they meet the SLO, recorded in the plan and replayed by ``simulate --plan``."""

from __future__ import annotations

import csv
import json
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from cli.main import cli
from moeless.contracts.loads import Loads
from moeless.contracts.plan import load_plan
from moeless.errors import SimulationError
from moeless.simulation.policies import Deployment
from moeless.simulation.routing import SampledRouting
from moeless.simulation.simulator import Request
from moeless.simulation.speculation import Acceptance
from moeless.sizing import DEFAULT_SEARCH, Slo, SloUnreachable, lambda_floor_ms, size_for_slo
from moeless.sizing.report import speculation_lines
from moeless.sizing.structures import drafts_searched
from tests.sizing.test_sizing import BARE, one_expert_shape

MTP = Acceptance((0.85,), "hand-made")
# one structure per number of drafts: Lambda alone, one memory size, no replicas or packing
ONE = replace(BARE, replica_scales=(1,), packings=(1,), memory_mb=(1769,), exhaustive=False)


def test_with_a_drafter_k_is_searched_from_0_to_the_positions_its_acceptance_covers():
    plain = Deployment.choose(one_expert_shape())
    assert drafts_searched(plain, DEFAULT_SEARCH) == [0]
    three = replace(plain, draft_acceptance=Acceptance((0.8, 0.6, 0.5), "given"))
    assert drafts_searched(three, DEFAULT_SEARCH) == [0, 1, 2, 3]
    assert drafts_searched(replace(three, speculate=5), replace(DEFAULT_SEARCH, speculate=(0, 2))) == [
        5,
        0,
        2,
    ]
    with pytest.raises(SimulationError, match="needs a drafter"):
        drafts_searched(plain, replace(DEFAULT_SEARCH, speculate=(1,)))


def test_the_optimiser_drafts_where_only_drafting_meets_the_slo():
    """One expert per token, requests 20 s apart, 64 tokens each: one token per forward never
    decodes under the Lambda floor; with MTP's 1.85 tokens per forward a TPOT between the floor
    / 1.85 and the floor is met, by k = 1 alone."""
    deployment = Deployment.choose(one_expert_shape(), draft_acceptance=MTP)
    routing = SampledRouting.from_loads(Loads({0: np.array([4.0, 3, 2, 1])}, {"top_k": 1}), 1, [0], 1)
    replay = [Request(20.0 * n, 8, 64, n) for n in range(10)]
    floor = lambda_floor_ms(deployment, 1769)
    assert lambda_floor_ms(replace(deployment, speculate=1), 1769) == pytest.approx(floor / 1.85)
    slo = Slo(0.8 * floor)
    with pytest.raises(SloUnreachable):
        size_for_slo("moeless", replace(deployment, draft_acceptance=None), routing, replay, 200.0, slo, ONE)
    sizing = size_for_slo("moeless", deployment, routing, replay, 200.0, slo, ONE)
    assert {p.speculate for p in sizing.points} == {0, 1}
    assert sizing.chosen.speculate == 1 and sizing.floor_ms == pytest.approx(floor / 1.85)
    assert sizing.chosen.summary["tokens_per_forward"] > 1.5
    recorded = sizing.chosen.plan.params["deployment"]
    assert recorded["speculate"] == 1 and recorded["draft_acceptance"] == MTP.to_json()
    line, cheapest = speculation_lines(sizing)
    assert "k=1 drafts per forward, 1.85 tokens per forward" in line
    assert "k=0: misses the SLO; k=1: $" in cheapest


@pytest.fixture
def files(tmp_path):
    loads = tmp_path / "loads.json"
    layers = [{"layer": 0, "counts": [50, 30, 10, 5, 3, 1, 1, 0]}]
    loads.write_text(json.dumps({"model": "mistralai/Mixtral-8x7B-v0.1", "top_k": 2, "num_model_layers": 32,
                                 "layers": layers}))  # fmt: skip
    arrivals = tmp_path / "arrivals.csv"
    arrivals.write_text("timestamp_s,input_tokens,output_tokens\n0,20,9\n5,10,7\n200,25,9\n")
    search = tmp_path / "search.json"
    search.write_text(json.dumps({"host_shares": [], "alternatives": False, "replica_scales": [1],
                                  "packings": [1], "stall_bound": False, "every_level_premium": None,
                                  "processes": 1, "speculate": [1]}))  # fmt: skip
    common = ["--loads", str(loads), "--arrivals", str(arrivals), "--duration", "300"]
    return {"common": common, "search": str(search), "plan": tmp_path / "plan.json", "out": tmp_path / "sim"}


def test_plan_records_the_drafts_it_chose_and_simulate_replays_them(files):
    runner = CliRunner()
    plan_path = files["plan"]
    sized = runner.invoke(
        cli,
        ["plan", *files["common"], "--policy", "moeless", "--slo-tpot-ms", "1e7", "--speculate", "1",
         "--draft-acceptance", "0.9", "--search", files["search"], "-o", str(plan_path)],
    )  # fmt: skip
    assert sized.exit_code == 0, sized.output
    assert "speculation: k=1 drafts per forward, 1.90 tokens per forward" in sized.output
    recorded = load_plan(plan_path).params["deployment"]
    assert recorded["speculate"] == 1 and recorded["draft_acceptance"] == {
        "rates": [0.9],
        "source": "given: 0.9",
    }
    replay = ["simulate", *files["common"], "--plan", str(plan_path), "--no-plots", "-o", str(files["out"])]
    replayed = runner.invoke(cli, replay)
    assert replayed.exit_code == 0, replayed.output
    results = {r["policy"]: r for r in csv.DictReader((files["out"] / "results.csv").open())}
    assert float(results["moeless"]["tokens_per_forward"]) > 1.0
    assert float(results["static"]["tokens_per_forward"]) > 1.0  # every policy drafts alike
    planned = load_plan(plan_path).params["sizing"]["planned"]
    assert float(results["moeless"]["usd_per_1k_requests"]) == pytest.approx(planned["usd_per_1k_requests"])
    contradicted = runner.invoke(cli, [*replay, "--speculate", "0"])
    assert contradicted.exit_code == 2 and "sized for speculate 1, not 0" in contradicted.output
    other = runner.invoke(cli, [*replay, "--draft-acceptance", "0.5"])
    assert other.exit_code == 2 and "sized for a draft acceptance of [0.9], not [0.5]" in other.output


@pytest.mark.parametrize(
    ("command", "given", "says"),
    [
        pytest.param(
            "simulate", ["--speculate", "1"], "--speculate 1 needs --draft-acceptance", id="no acceptance"
        ),
        pytest.param(
            "simulate", ["--draft-acceptance", "0.8"], "--draft-acceptance applies only with --speculate",
            id="acceptance unused",
        ),
        pytest.param(
            "simulate", ["--speculate", "1", "--draft-acceptance", "mtp"], "has no multi-token prediction",
            id="no mtp",
        ),
        pytest.param("plan", ["--speculate", "1"], "--speculate 1 needs --draft-acceptance", id="plan"),
    ],
)  # fmt: skip
def test_drafts_without_their_acceptance_are_refused(files, command, given, says):
    out = ["-o", str(files["out"])] if command == "simulate" else ["-o", str(files["plan"])]
    sized = ["--policy", "moeless", "--slo-tpot-ms", "100"] if command == "plan" else []
    result = CliRunner().invoke(cli, [command, *files["common"], *sized, *given, *out])
    assert result.exit_code == 2 and says in result.output, result.output
