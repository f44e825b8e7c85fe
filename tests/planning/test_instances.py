"""The instance catalogue: the cheapest fleet that holds a model, and a user's catalogue refused
clearly when it is malformed."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from moeless.errors import CatalogueError
from moeless.planning.cost_model import CostModel
from moeless.planning.instances import (
    CATALOGUE,
    USABLE_FRACTION,
    Fleet,
    Instance,
    cheapest_fleet,
    load_catalogue,
)

GB = 1e9


def instance(name: str, memory_gb: float, usd: float, gbps: float = 100.0, gpus: int = 1) -> Instance:
    return Instance(name, gpus, "test GPU", memory_gb, gbps, 10.0, usd, "hand-made")


# GIVEN 10 GB at $1/h, 40 GB at $3/h and 100 GB at $10/h (usable: 90% of each)
HAND = {i.name: i for i in (instance("small", 10, 1.0), instance("mid", 40, 3.0), instance("big", 100, 10.0))}


@pytest.mark.parametrize(
    ("needed_gb", "label", "usd"),
    [
        pytest.param(5, "1x small", 1.0, id="one-small-fits"),
        pytest.param(9, "1x small", 1.0, id="exactly-the-usable-90-percent"),
        pytest.param(9.5, "2x small", 2.0, id="two-small-beat-one-mid"),
        pytest.param(30, "1x mid", 3.0, id="4-small-cost-4-one-mid-3"),
        pytest.param(100, "3x mid", 9.0, id="3-mid-beat-1-big"),
        pytest.param(300, "9x mid", 27.0, id="9-mid-beat-4-big"),
    ],
)
def test_the_cheapest_fleet_that_fits_is_chosen(needed_gb, label, usd):
    fleet = cheapest_fleet(needed_gb * GB, HAND)
    assert fleet.label() == label and fleet.hourly_usd == pytest.approx(usd)
    assert fleet.memory_bytes >= needed_gb * GB
    # THEN no homogeneous fleet that holds it is cheaper
    for other in HAND.values():
        for count in range(1, 17):
            if Fleet(other, count).memory_bytes >= needed_gb * GB:
                assert Fleet(other, count).hourly_usd >= fleet.hourly_usd - 1e-9


def test_ties_go_to_fewer_instances_then_more_bandwidth():
    one = instance("one-big", 20, 2.0)
    two = instance("two-small", 10, 1.0)
    assert cheapest_fleet(15 * GB, {"two-small": two, "one-big": one}).label() == "1x one-big"
    slow, fast = instance("slow", 10, 1.0, gbps=100), instance("fast", 10, 1.0, gbps=900)
    assert cheapest_fleet(5 * GB, {"slow": slow, "fast": fast}).label() == "1x fast"


def test_nothing_that_fits_is_refused_with_the_bytes_and_the_biggest_fleet():
    with pytest.raises(CatalogueError, match=r"2,000\.0 GB.*16x big, holds 1,440\.0 GB"):
        cheapest_fleet(2000 * GB, HAND)
    with pytest.raises(CatalogueError, match=r"2x big"):
        cheapest_fleet(500 * GB, HAND, max_instances=2)


def test_fleet_totals():
    fleet = Fleet(CATALOGUE["p5.48xlarge"], 2)
    assert fleet.label() == "2x p5.48xlarge"
    assert fleet.memory_bytes == pytest.approx(2 * 640 * GB * USABLE_FRACTION)
    assert fleet.hbm_gbps == 2 * 8 * 3350 and fleet.tflops_16bit == 2 * 8 * 989
    assert fleet.hourly_usd == pytest.approx(2 * 55.04)


def test_the_built_in_catalogue_has_the_asked_types_each_with_a_source():
    asked = [
        "g5.xlarge",
        "g5.12xlarge",
        "g5.48xlarge",
        "g6.xlarge",
        "g6.12xlarge",
        "g6.48xlarge",
        "g6e.xlarge",
        "g6e.12xlarge",
        "g6e.48xlarge",
        "p4d.24xlarge",
        "p4de.24xlarge",
        "p5.48xlarge",
        "p5e.48xlarge",
        "p5en.48xlarge",
    ]
    assert set(asked) <= set(CATALOGUE)
    for name, inst in CATALOGUE.items():
        assert inst.name == name and inst.source and "specs:" in inst.source
        assert inst.hourly_usd > 0 and inst.gpu_memory_gb > 0 and inst.hbm_gbps > 0
    # the after-June-2025 prices, and the H200s hold DeepSeek-V3 in fp8 on one instance
    assert CATALOGUE["p5.48xlarge"].hourly_usd == 55.04
    assert cheapest_fleet(671e9, CATALOGUE, max_instances=1).label() == "1x p5en.48xlarge"
    # the cost model's backbone GPU comes from the catalogue
    assert CostModel().gpu is CATALOGUE["g5.xlarge"]


def write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "catalogue.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_a_users_catalogue_replaces_the_built_in_one(tmp_path):
    rows = [asdict(HAND["small"]), asdict(HAND["mid"]) | {"gpu_memory_gb": 40}]
    catalogue = load_catalogue(write(tmp_path, rows))
    assert list(catalogue) == ["small", "mid"] and catalogue["mid"] == HAND["mid"]
    assert cheapest_fleet(30 * GB, catalogue).label() == "1x mid"


GOOD = asdict(instance("x", 10, 1.0))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param("[{", "not readable JSON", id="not-json"),
        pytest.param({"instances": [GOOD]}, "non-empty JSON list", id="not-a-list"),
        pytest.param([], "non-empty JSON list", id="empty"),
        pytest.param(["g5.xlarge"], "instance 0 is not an object", id="entry-not-an-object"),
        pytest.param(
            [{k: v for k, v in GOOD.items() if k != "hourly_usd"}],
            r"instance 0 \(x\) lacks hourly_usd",
            id="missing",
        ),
        pytest.param([GOOD | {"spot_usd": 0.3}], "unknown field.*spot_usd", id="unknown-field"),
        pytest.param(
            [GOOD | {"hourly_usd": "1.0"}], "hourly_usd must be a number above 0", id="price-as-text"
        ),
        pytest.param([GOOD | {"gpu_memory_gb": 0}], "gpu_memory_gb must be a number above 0", id="no-memory"),
        pytest.param([GOOD | {"gpus": 1.5}], "gpus must be a whole number", id="fractional-gpus"),
        pytest.param([GOOD | {"name": " "}], "name must be a non-empty string", id="blank-name"),
        pytest.param([GOOD, GOOD], "instance 1 repeats the name 'x'", id="duplicate"),
    ],
)
def test_a_malformed_catalogue_is_refused(tmp_path, data, message):
    with pytest.raises(CatalogueError, match=message):
        load_catalogue(write(tmp_path, data))


def test_a_missing_catalogue_file_is_refused(tmp_path):
    with pytest.raises(CatalogueError, match="not readable"):
        load_catalogue(tmp_path / "nope.json")
