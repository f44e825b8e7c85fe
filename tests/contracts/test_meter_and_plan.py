"""The billing meter against a hand computation, and the plan file's validation."""

from __future__ import annotations

import json

import pytest

from moeless.aws_prices import PRICES, billed_ms, gb_seconds, vcpus_for_memory
from moeless.contracts.manifest import load_manifest
from moeless.contracts.plan import Backbone, load_plan, one_function_per_expert, plan_from_dict
from moeless.errors import PlanError
from moeless.lambda_host.meter import BillingMeter, format_bill
from tests.fakes import FakeClock


def test_meter_matches_a_hand_computation():
    clock = FakeClock()
    meter = BillingMeter(clock=clock)
    meter.register("f", 2048)
    # warm 0.4 ms -> 1 ms; cold 2.5 ms after 100.2 ms of init -> 103 ms; provisioned 7.01 ms -> 8 ms
    assert meter.invoke("f", 0.4) == 1
    assert meter.invoke("f", 2.5, init_ms=100.2) == 103
    meter.set_provisioned("f", "live", 3)
    clock.now += 10.0  # 10 s of 3 provisioned instances: billed as 5 minutes
    assert meter.invoke("f", 7.01, provisioned=True) == 8
    meter.throttle("f")
    clock.now += 290.0
    meter.set_provisioned("f", "live", 1)  # 300 s at 3, then 301 s at 1 -> 10 minutes
    clock.now += 301.0
    meter.set_provisioned("f", "live", 0)
    row = meter.snapshot()["functions"]["f"]

    assert row["requests"] == 3 and row["cold_starts"] == 1 and row["throttles"] == 1
    assert row["billed_ms"] == 104 and row["billed_ms_provisioned"] == 8
    assert row["gb_seconds"] == pytest.approx(0.104 * 2)
    assert row["provisioned_concurrency_seconds"] == pytest.approx(3 * 300 + 301)
    assert row["provisioned_gb_seconds"] == pytest.approx((3 * 300 + 1 * 600) * 2)
    expected = (
        3 * 0.20 / 1e6 + 0.208 * 0.0000166667 + 0.008 * 2 * 0.0000097222 + (900 + 600) * 2 * 0.0000041667
    )
    assert row["cost_usd"] == pytest.approx(expected)
    assert "f" in format_bill(meter.snapshot()) and "USD" in format_bill(meter.snapshot())


def test_open_provisioned_period_is_charged_up_to_now():
    clock = FakeClock()
    meter = BillingMeter(clock=clock)
    meter.register("f", 1024)
    meter.set_provisioned("f", "live", 2)
    clock.now += 1.0
    assert meter.snapshot()["functions"]["f"]["provisioned_gb_seconds"] == pytest.approx(2 * 300)
    assert meter.snapshot()["totals"]["provisioned_gb_seconds"] == pytest.approx(2 * 300)


def test_price_helpers():
    assert billed_ms(0.001) == 1 and billed_ms(3.0) == 3 and billed_ms(3.0001) == 4
    assert gb_seconds(1000, 1024) == 1.0
    assert [vcpus_for_memory(m) for m in (128, 1769, 3538, 10240)] == [1, 1, 2, 5]
    assert PRICES.source


def test_default_plan_round_trips_and_fits(tiny, tmp_path):
    manifest = load_manifest(tiny.package("mixtral"))
    plan = one_function_per_expert(manifest)
    assert len(plan.functions) == len(manifest.experts)
    plan.save(tmp_path / "plan.json")
    again = load_plan(tmp_path / "plan.json", manifest)
    assert again.to_dict() == plan.to_dict()


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(schema_version=9), "schema_version 9 .* plan again with `moeless plan`"),
        (lambda d: d["layers"][0]["experts"][0].update(placement="backbone"), "gpu|host|function"),
        (lambda d: d["layers"][0]["experts"][0].update(offload_rows=4), "offload_rows is for gpu or host"),
        (lambda d: d.update(backbone={"instance": "g6e.xlarge", "count": 0}), "backbone count"),
        (lambda d: d["functions"][0].update(memory_mb=64), "outside Lambda's"),
        (lambda d: d["functions"][0].update(name="bad name!"), "not a valid Lambda name"),
        (
            lambda d: d["functions"][0].update(provisioned_concurrency=3, reserved_concurrency=1),
            "provisioned",
        ),
        (lambda d: d["layers"][0]["experts"].pop(0), "places no replica"),
        (lambda d: d["functions"][0].update(experts=[[9, 9]]), "do not have"),
        (lambda d: d["layers"][0]["experts"][0].update(replicas=0), "replicas >= 1"),
        (lambda d: d.pop("layers"), "malformed"),
        (lambda d: d["functions"].append(dict(d["functions"][0])), "not unique"),
    ],
)
def test_bad_plans_are_refused_with_a_reason(tiny, mutate, message):
    manifest = load_manifest(tiny.package("mixtral"))
    data = json.loads(json.dumps(one_function_per_expert(manifest).to_dict()))
    mutate(data)
    with pytest.raises(PlanError, match=message):
        plan_from_dict(data).check_fits(manifest)


def test_a_version_1_plan_is_read_with_its_backbone_experts_on_the_host(tiny):
    manifest = load_manifest(tiny.package("mixtral"))
    data = json.loads(json.dumps(one_function_per_expert(manifest).to_dict()))
    data["schema_version"] = 1
    del data["backbone"]
    first = data["layers"][0]["experts"][0]
    first.update(placement="backbone", function=None)
    data["functions"] = [f for f in data["functions"] if f["name"] != "moeless-l000-e000"]
    plan = plan_from_dict(data)
    plan.check_fits(manifest)
    assert plan.tiers() == {(0, 0): "host"} and plan.backbone is None
    assert plan.to_dict()["schema_version"] == 2


def test_tiers_offloads_and_the_backbone_round_trip(tiny, tmp_path):
    manifest = load_manifest(tiny.package("mixtral"))
    plan = one_function_per_expert(manifest)
    plan.experts[0].placement, plan.experts[0].function = "gpu", None
    plan.functions = plan.functions[1:]
    plan.experts[1].placement, plan.experts[1].offload_rows = "host", 16
    plan.backbone = Backbone("g6e.4xlarge", 2)
    plan.save(tmp_path / "plan.json")
    again = load_plan(tmp_path / "plan.json", manifest)
    assert again.to_dict() == plan.to_dict() and again.backbone == Backbone("g6e.4xlarge", 2)
    first, second = [(e.layer, e.expert) for e in plan.experts[:2]]
    assert again.tiers() == {first: "gpu", second: "host"}
    assert again.offloads() == {second: 16}
    assert again.invoke_targets()[second] == ["moeless-l000-e001"] and first not in again.invoke_targets()


def test_unreadable_plan_file(tmp_path):
    (tmp_path / "plan.json").write_text("{oops")
    with pytest.raises(PlanError, match="not valid JSON"):
        load_plan(tmp_path / "plan.json")
    with pytest.raises(PlanError, match="cannot read"):
        load_plan(tmp_path / "missing.json")
