"""The account's quotas a plan must fit: reserved, provisioned and kept-warm environments and the
busiest layer's on-demand invokes within the concurrent executions, with Lambda's 100 unreserved;
every function within the memory cap. Each refusal names the quota and the increase to ask for;
``plan`` and ``simulate`` refuse a plan that does not fit."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cli.main import cli
from moeless.contracts.plan import ExpertPlacement, FunctionSpec, Plan
from moeless.errors import PlanDoesNotFit
from moeless.planning.quotas import (
    CONCURRENCY_QUOTA,
    MEMORY_QUOTA,
    AccountQuotas,
    Concurrency,
    concurrency_of,
    quota_shortfalls,
    require_quotas,
)

MIXTRAL = {"model": "mistralai/Mixtral-8x7B-v0.1", "top_k": 2, "num_model_layers": 32,
           "layers": [{"layer": 0, "counts": [50, 30, 10, 5, 3, 1, 1, 0]}]}  # fmt: skip


def two_layers() -> Plan:
    """Layer 0: expert 0 in three environments of a, expert 1 in two of b; layer 1: one of c."""
    experts = [
        ExpertPlacement(0, 0, replicas=3, function="a"),
        ExpertPlacement(0, 1, replicas=2, function="b"),
        ExpertPlacement(1, 0, function="c"),
    ]
    functions = [FunctionSpec("a", [(0, 0)]), FunctionSpec("b", [(0, 1)]), FunctionSpec("c", [(1, 0)])]
    return Plan("moeless", experts, functions)


def one_wide_layer(experts: int, replicas: int) -> Plan:
    """One layer of ``experts``, each its own function with ``replicas`` environments."""
    placements = [ExpertPlacement(0, e, replicas=replicas, function=f"f{e}") for e in range(experts)]
    return Plan("moeless", placements, [FunctionSpec(f"f{e}", [(0, e)]) for e in range(experts)])


def test_a_plan_within_the_quotas_has_no_shortfall():
    plan = two_layers()
    plan.functions[0].provisioned_concurrency = 2
    plan.functions[2].keep_warm = 3
    assert concurrency_of(plan) == Concurrency(reserved=0, held=5, peak_on_demand=3, busiest_layer=0)
    assert quota_shortfalls(plan) == []
    require_quotas(plan, AccountQuotas(concurrency=105, max_function_memory_mb=3008))


def test_a_layers_invokes_count_beyond_their_functions_provisioned_and_not_within_a_reservation():
    plan = two_layers()
    assert concurrency_of(plan).peak_on_demand == 5  # layer 0: 3 + 2 invokes at once
    plan.functions[0].provisioned_concurrency = 2  # two of a's three find a provisioned environment
    plan.functions[1].reserved_concurrency = 2  # b's invokes stay within its reservation
    assert concurrency_of(plan) == Concurrency(reserved=2, held=2, peak_on_demand=1, busiest_layer=0)


def test_a_layer_over_the_account_is_refused_naming_the_quota_and_the_increase():
    # DeepSeek-V3's 256 experts of a layer, each in 4 environments: 1,024 invokes at once
    plan = one_wide_layer(256, 4)
    [shortfall] = quota_shortfalls(plan)
    assert (shortfall.quota, shortfall.needed, shortfall.have, shortfall.more) == (
        CONCURRENCY_QUOTA,
        1024,
        1000,
        24,
    )
    assert str(shortfall) == (
        "Lambda 'Concurrent executions' (Service Quotas code L-B99A9384): the plan needs 1,024, the "
        "account has 1,000 (0 reserved, 0 provisioned or kept warm without a reservation, 1,024 "
        "on-demand invokes of layer 0 at once); ask for 24 more"
    )
    with pytest.raises(PlanDoesNotFit, match=r"L-B99A9384.*ask for 24 more"):
        require_quotas(plan)
    require_quotas(plan, AccountQuotas(concurrency=1024))


def test_reservations_must_leave_100_unreserved():
    plan = two_layers()
    plan.functions[2].reserved_concurrency = 950
    [shortfall] = quota_shortfalls(plan)
    assert (shortfall.needed, shortfall.have) == (1050, 1000)
    assert "950 reserved, 0 provisioned or kept warm without a reservation, 100 left unreserved" in str(
        shortfall
    )
    plan.functions[2].reserved_concurrency = 900
    assert quota_shortfalls(plan) == []


def test_a_function_over_the_memory_cap_is_refused_naming_it():
    plan = two_layers()
    plan.functions[1].memory_mb = 4096
    plan.functions[2].memory_mb = 3538
    new_account = AccountQuotas(max_function_memory_mb=3008)
    [shortfall] = quota_shortfalls(plan, new_account)
    assert (shortfall.quota, shortfall.needed, shortfall.have, shortfall.more) == (
        MEMORY_QUOTA,
        4096,
        3008,
        1088,
    )
    with pytest.raises(PlanDoesNotFit, match="2 function\\(s\\) above it, e.g. b"):
        require_quotas(plan, new_account)
    assert quota_shortfalls(plan) == []  # 10,240 MB by default


def test_plan_refuses_to_write_a_plan_the_account_cannot_hold(tmp_path):
    loads = tmp_path / "loads.json"
    loads.write_text(json.dumps(MIXTRAL))
    out = tmp_path / "plan.json"
    args = ["plan", "--loads", str(loads), "--policy", "moeless", "-o", str(out)]
    refused = CliRunner().invoke(cli, [*args, "--account-concurrency", "10"])
    assert refused.exit_code == 1 and not out.exists()
    assert "L-B99A9384" in refused.output and "the account has 10 " in refused.output
    planned = CliRunner().invoke(cli, args)
    assert planned.exit_code == 0, planned.output
    assert out.exists()


def test_simulate_refuses_a_plan_the_account_cannot_hold(tmp_path):
    loads = tmp_path / "loads.json"
    loads.write_text(json.dumps(MIXTRAL))
    two_layers().save(tmp_path / "plan.json")
    args = [
        "simulate",
        "--loads",
        str(loads),
        "--plan",
        str(tmp_path / "plan.json"),
        "-o",
        str(tmp_path / "s"),
    ]
    refused = CliRunner().invoke(cli, [*args, "--account-concurrency", "50"])
    assert refused.exit_code == 1 and "ask for 50 more" in refused.output
    assert not (tmp_path / "s").exists()
