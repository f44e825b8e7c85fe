"""The deployment both sides need, and what the study derives from the runs."""

from __future__ import annotations

import numpy as np
import pytest

from moeless.model.shapes import resolve_model
from moeless.planning.instances import CATALOGUE
from moeless.simulation.policies import Deployment, crossover_rate, requests_replaying, serving_fleet
from moeless.simulation.routing import RecordedRouting


def test_the_fleet_holds_the_whole_model_on_one_instance_where_one_can():
    deployment = Deployment.choose(resolve_model("deepseek-v3"))  # fp8: 671 GB + the KV cache
    assert deployment.fleet.count == 1 and deployment.fleet.instance.gpus == 8
    assert deployment.fleet.memory_bytes >= 671e9 + deployment.kv_bytes
    assert deployment.backbone.count == 1
    assert deployment.backbone.memory_bytes >= deployment.shape.dense_bytes("fp8") + deployment.kv_bytes
    # every single instance that would hold the backbone costs at least what was chosen
    need = deployment.shape.dense_bytes("fp8") + deployment.kv_bytes
    holders = [i for i in CATALOGUE.values() if i.gpu_memory_gb * 1e9 * 0.9 >= need]
    assert deployment.backbone.hourly_usd == min(i.hourly_usd for i in holders)


def test_a_model_no_instance_holds_goes_on_full_nodes_not_many_small_gpus():
    fleet = serving_fleet(resolve_model("deepseek-v3").total_params * 2, CATALOGUE)  # bf16: 1.34 TB
    assert fleet.count > 1 and fleet.instance.gpus >= 8
    assert fleet.memory_bytes >= resolve_model("deepseek-v3").total_params * 2


def test_the_crossover_rate_interpolates_where_the_fleet_becomes_cheaper():
    rates = [0.01, 0.1, 1.0]
    assert crossover_rate(rates, [5.0, 8.0, 9.0], [10.0, 6.0, 1.0]) == pytest.approx(0.01 + 0.09 * 5 / 7)
    assert crossover_rate(rates, [1.0, 1.0, 1.0], [5.0, 4.0, 3.0]) is None
    assert crossover_rate(rates, [9.0, 9.0, 9.0], [1.0, 1.0, 1.0]) == 0.01


def test_replayed_requests_keep_each_recorded_length_in_turn():
    routing = RecordedRouting([np.zeros((3, 1, 1), int)] * 2, [np.zeros((0, 1, 1), int)] * 2, 2, 1, [0], [0],
                              "", "hand", [(5, 3), (7, 2)])  # fmt: skip
    replay = requests_replaying(np.array([0.0, 1.0, 2.0]), routing)
    assert [(r.prompt_tokens, r.output_tokens, r.source) for r in replay] == [(5, 3, 0), (7, 2, 1), (5, 3, 2)]
