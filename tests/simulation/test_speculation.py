"""Speculative decoding in the simulator: the acceptance it replays (measured, given or published),
and a step's tokens per forward, rows and invokes on hand-made acceptances."""

from __future__ import annotations

import json

import numpy as np
import pytest

from moeless.contracts.loads import Loads
from moeless.errors import SimulationError
from moeless.planning.cost_model import CostModel
from moeless.simulation.policies import Deployment
from moeless.simulation.routing import SampledRouting
from moeless.simulation.simulator import PolicyResult, Request, Simulator
from moeless.simulation.speculation import Acceptance
from tests.simulation.test_simulator import GPU, HARDWARE, SIZE, one_function_each, sampled, toy_shape


def test_expected_tokens_multiply_the_conditional_rates_and_stop_past_them():
    acceptance = Acceptance((0.8, 0.5), "hand")
    assert acceptance.expected_tokens(0) == 1.0
    assert acceptance.expected_tokens(1) == pytest.approx(1.8)
    assert acceptance.expected_tokens(2) == pytest.approx(1 + 0.8 + 0.8 * 0.5)
    assert acceptance.expected_tokens(5) == acceptance.expected_tokens(2)  # no rate: never kept
    rng = np.random.default_rng(0)
    draws = [acceptance.accepted(2, rng) for _ in range(20_000)]
    assert set(draws) == {0, 1, 2}
    assert np.mean(draws) == pytest.approx(0.8 + 0.4, abs=0.02)


def test_the_acceptance_an_engine_measured_is_its_counters_ratio_per_position():
    counters = {"draft_tried_1": 200, "draft_accepted_1": 160, "draft_tried_2": 160,
                "draft_accepted_2": 80, "draft_tokens_proposed": 400}  # fmt: skip
    measured = Acceptance.from_counters(counters, "served")
    assert measured.rates == (0.8, 0.5) and measured.source == "served"
    assert measured.carry == ()  # no room counted: every position filled
    with pytest.raises(SimulationError, match="no draft was tried"):
        Acceptance.from_counters({"decode_forwards": 9}, "served without drafts")


def test_a_drafter_that_stops_short_is_measured_by_the_positions_it_filled():
    counters = {"draft_room_1": 400, "draft_carried_1": 200, "draft_room_2": 200,
                "draft_carried_2": 150, "draft_tried_1": 200, "draft_accepted_1": 160,
                "draft_tried_2": 120, "draft_accepted_2": 60}  # fmt: skip
    measured = Acceptance.from_counters(counters, "served")
    assert measured.rates == (0.8, 0.5) and measured.carry == (0.5, 0.75)
    assert measured.expected_tokens(2) == pytest.approx(1 + 0.5 * 0.8 + 0.5 * 0.8 * 0.75 * 0.5)
    rng = np.random.default_rng(0)
    filled = [measured.carried(2, rng) for _ in range(20_000)]
    assert np.mean(filled) == pytest.approx(0.5 + 0.5 * 0.75, abs=0.02)
    assert measured.carried(5, rng) <= 2  # past the measured positions nothing is filled
    assert Acceptance.from_json(measured.to_json()) == measured
    assert "filled 0.5, 0.75" in measured.describe()


@pytest.mark.parametrize(
    ("text", "rates"),
    [
        pytest.param("0.85", (0.85,), id="one rate"),
        pytest.param("0.8, 0.6,0.5", (0.8, 0.6, 0.5), id="per position"),
        pytest.param("mtp", (0.85,), id="deepseek-v3 mtp"),
    ],
)
def test_a_cli_value_is_a_rate_rates_or_the_published_mtp_figure(text, rates):
    acceptance = Acceptance.parse(text, "deepseek-v3")
    assert acceptance.rates == rates
    if text == "mtp":
        assert "2412.19437" in acceptance.source and acceptance.expected_tokens(1) == pytest.approx(1.85)


@pytest.mark.parametrize(
    ("text", "model", "says"),
    [
        pytest.param("mtp", "mixtral-8x7b", "mixtral-8x7b has no multi-token prediction", id="no mtp"),
        pytest.param("most", "deepseek-v3", "not an acceptance: give mtp", id="not a number"),
        pytest.param("0.9,1.2", "deepseek-v3", "between 0 and 1", id="out of range"),
        pytest.param("missing.json", "deepseek-v3", "cannot read the counters", id="no file"),
    ],
)
def test_a_value_of_no_form_is_refused_naming_the_forms(text, model, says):
    with pytest.raises(SimulationError, match=says):
        Acceptance.parse(text, model)


def test_a_served_engines_counters_file_is_an_acceptance(tmp_path):
    path = tmp_path / "stats.json"
    path.write_text(json.dumps({"counters": {"draft_tried_1": 10, "draft_accepted_1": 7}, "dispatch": {}}))
    assert Acceptance.parse(str(path), "any") == Acceptance((0.7,), f"served counters in {path}")


def one_hot(layers: int = 2) -> SampledRouting:
    """Every token to expert 0 of each layer (top-1): one invoke per layer per step, whatever
    the rows, so invokes count steps."""
    loads = Loads({layer: np.array([1.0] + [0.0] * 7) for layer in range(layers)}, {"top_k": 1})
    return SampledRouting.from_loads(loads, 1, list(range(layers)), layers)


def simulate(
    k: int, rates: tuple[float, ...] | None, requests: list[Request], routing=None, acceptance=None
) -> PolicyResult:
    acceptance = acceptance or (Acceptance(rates, "hand-made") if rates is not None else None)
    sim = Simulator(one_function_each(), routing or one_hot(), SIZE, CostModel(), GPU, HARDWARE,
                    oracle=True, max_batch=8, timeline=False, speculate=k, acceptance=acceptance)  # fmt: skip
    return sim.run(requests, duration_s=1.0)


def test_every_draft_kept_gives_two_tokens_per_forward_and_half_the_invokes_per_token():
    # four requests at 0, 9 output tokens: the prefill step gives each its first token, then 8
    # decode tokens: 8 steps one at a time, 4 steps of two (every draft kept); one invoke per
    # layer per step (every token to expert 0)
    requests = [Request(0.0, 4, 9, n) for n in range(4)]
    plain, drafted = simulate(0, None, requests), simulate(1, (1.0,), requests)
    assert plain.summary()["tokens_per_forward"] == 1.0 and drafted.summary()["tokens_per_forward"] == 2.0
    assert (plain.steps, drafted.steps) == (1 + 8, 1 + 4)
    assert (plain.invokes, drafted.invokes) == (2 * (1 + 8), 2 * (1 + 4))
    assert drafted.decoded_tokens == plain.decoded_tokens == 4 * 8
    assert drafted.completed == 4 and max(drafted.tpot_ms) < 0.6 * min(plain.tpot_ms)
    lambda_usd = plain.usd["requests"] + plain.usd["duration"]
    assert 0 < drafted.decode_step_usd < 0.6 * plain.decode_step_usd < lambda_usd


def test_no_draft_kept_gives_one_token_per_forward_on_twice_the_rows():
    # the same requests, every draft refused: as many steps as without drafts, each decode step
    # carrying two rows per sequence, except the last (no room for a draft: the engine sends none)
    requests = [Request(0.0, 4, 9, n) for n in range(4)]
    plain, refused = simulate(0, None, requests), simulate(1, (0.0,), requests)
    assert refused.summary()["tokens_per_forward"] == 1.0 and refused.steps == plain.steps
    prompt_rows = 4 * 4
    assert sum(plain.tokens_served.values()) == 2 * (prompt_rows + 4 * 8)
    assert sum(refused.tokens_served.values()) == 2 * (prompt_rows + 4 * (2 * 7 + 1))
    assert refused.invokes == plain.invokes  # the same invokes, carrying the drafts too


def test_a_drafter_that_never_fills_a_position_costs_no_rows():
    # prompt lookup on text that never repeats: room for a draft every step, none carried
    requests = [Request(0.0, 4, 9, n) for n in range(4)]
    plain = simulate(0, None, requests)
    empty = simulate(1, None, requests, acceptance=Acceptance((1.0,), "hand-made", carry=(0.0,)))
    assert empty.summary()["tokens_per_forward"] == 1.0 and empty.steps == plain.steps
    assert empty.tokens_served == plain.tokens_served and empty.invokes == plain.invokes


def test_a_sequence_never_generates_past_its_output():
    # 8 output tokens, every draft kept: 7 decode tokens in forwards of 2, 2, 2, then 1
    result = simulate(2, (1.0, 1.0), [Request(0.0, 4, 8, n) for n in range(3)])
    assert result.completed == 3 and result.decoded_tokens == 3 * 7
    assert result.verifications == 3 * 3  # 3 + 3 + 1: the last forward has room for one draft


def test_half_the_drafts_kept_average_one_and_a_half_tokens_per_forward():
    result = simulate(1, (0.5,), [Request(0.0, 4, 401, n) for n in range(4)], routing=sampled())
    assert result.completed == 4 and result.decoded_tokens == 4 * 400
    assert result.summary()["tokens_per_forward"] == pytest.approx(1.5, abs=0.05)


def test_a_deployment_drafts_only_with_an_acceptance_and_records_both():
    with pytest.raises(SimulationError, match="speculate 1"):
        Deployment.choose(toy_shape(2), speculate=1)
    mtp = Acceptance((0.85,), "published")
    deployment = Deployment.choose(toy_shape(2), speculate=1, draft_acceptance=mtp)
    assert deployment.tokens_per_forward == pytest.approx(1.85)
    params = deployment.params()
    assert params["speculate"] == 1 and params["draft_acceptance"] == {"rates": [0.85], "source": "published"}
    assert Acceptance.from_json(params["draft_acceptance"]) == mtp
    assert any("1.85 tokens per forward" in line for line in deployment.describe())
