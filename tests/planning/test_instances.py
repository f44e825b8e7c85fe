"""The instance catalogue: the cheapest fleet that holds a model, the cheapest single instance that
holds a hybrid backbone (GPU and host RAM), the hosts' figures, and a user's catalogue refused clearly
when it is malformed."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from moeless.errors import CatalogueError
from moeless.planning.cost_model import CostModel
from moeless.planning.instances import (
    CATALOGUE,
    HOST_BANDWIDTH_EFFICIENCY,
    HOST_USABLE_FRACTION,
    USABLE_FRACTION,
    Fleet,
    Instance,
    cheapest_backbone,
    cheapest_fleet,
    load_catalogue,
)

GB = 1e9
GIB = 2**30


def instance(
    name: str, memory_gb: float, usd: float, gbps: float = 100.0, gpus: int = 1, host_gib: float = 64.0
) -> Instance:
    return Instance(
        name=name,
        gpus=gpus,
        gpu="test GPU",
        gpu_memory_gb=memory_gb,
        hbm_gbps=gbps,
        tflops_16bit=10.0,
        hourly_usd=usd,
        source="hand-made",
        vcpus=8,
        host_memory_gb=host_gib,
        host_memory_gbps=50.0,
        host_source="hand-made",
    )


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
        "g5.2xlarge",
        "g5.4xlarge",
        "g5.8xlarge",
        "g5.16xlarge",
        "g5.12xlarge",
        "g5.48xlarge",
        "g6.xlarge",
        "g6.2xlarge",
        "g6.4xlarge",
        "g6.8xlarge",
        "g6.16xlarge",
        "g6.12xlarge",
        "g6.48xlarge",
        "g6e.xlarge",
        "g6e.2xlarge",
        "g6e.4xlarge",
        "g6e.8xlarge",
        "g6e.16xlarge",
        "g6e.12xlarge",
        "g6e.24xlarge",
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
        assert inst.vcpus > 0 and inst.host_memory_gb > 0 and inst.host_memory_gbps > 0
        assert "read 2026-" in inst.host_source and "bandwidth:" in inst.host_source
    # the after-June-2025 prices, and the H200s hold DeepSeek-V3 in fp8 on one instance
    assert CATALOGUE["p5.48xlarge"].hourly_usd == 55.04
    assert cheapest_fleet(671e9, CATALOGUE, max_instances=1).label() == "1x p5en.48xlarge"
    # the cost model's backbone GPU comes from the catalogue
    assert CostModel().gpu is CATALOGUE["g5.xlarge"]


def test_the_hosts_are_awss_figures():
    # vCPUs and GiB as AWS's accelerated-computing specifications list them
    for name, vcpus, gib in [
        ("g5.xlarge", 4, 16),
        ("g5.16xlarge", 64, 256),
        ("g6e.xlarge", 4, 32),
        ("g6e.48xlarge", 192, 1536),
        ("p4d.24xlarge", 96, 1152),
        ("p5.4xlarge", 16, 256),
        ("p5en.48xlarge", 192, 2048),
    ]:
        assert (CATALOGUE[name].vcpus, CATALOGUE[name].host_memory_gb) == (vcpus, gib), name
    assert CATALOGUE["g5.xlarge"].host_memory_bytes == 16 * GIB
    assert CATALOGUE["g5.xlarge"].host_bytes_usable == pytest.approx(16 * GIB * HOST_USABLE_FRACTION)


@pytest.mark.parametrize(
    ("name", "gbps"),
    [
        # 2 sockets x 6 channels x 2,933 MT/s x 8 bytes = 281.568 GB/s, the whole host
        pytest.param("p4d.24xlarge", 281.568, id="cascade-lake-whole-host"),
        # 2 x 8 x 3,200 x 8 = 409.6 GB/s over the host's 192 vCPUs, of which g5.xlarge has 4
        pytest.param("g5.xlarge", 409.6 * 4 / 192, id="rome-vcpu-share"),
        pytest.param("g6e.24xlarge", 409.6 * 96 / 192, id="milan-half-host"),
        # 2 x 8 x 4,800 x 8 = 614.4 GB/s
        pytest.param("p5en.48xlarge", 614.4, id="sapphire-rapids-ddr5"),
    ],
)
def test_host_bandwidth_is_channels_times_speed_derated_and_shared_by_vcpu(name, gbps):
    assert HOST_BANDWIDTH_EFFICIENCY == 0.75
    assert CATALOGUE[name].host_memory_gbps == pytest.approx(gbps * 0.75)


# GIVEN two 24 GB GPUs, one with 16 GiB of RAM at $1/h, one with 128 GiB at $2/h, and an 80 GB GPU
# with 64 GiB at $5/h (usable: 90% of GPU memory, 85% of RAM)
BACKBONES = {
    i.name: i
    for i in (
        instance("lean", 24, 1.0, host_gib=16),
        instance("roomy", 24, 2.0, host_gib=128),
        instance("big", 80, 5.0, host_gib=64),
    )
}


@pytest.mark.parametrize(
    ("gpu_gb", "host_gb", "name"),
    [
        pytest.param(10, 5, "lean", id="both-fit-the-cheapest"),
        pytest.param(21.6, 16 * GIB * HOST_USABLE_FRACTION / GB, "lean", id="exactly-the-usable-fractions"),
        pytest.param(10, 50, "roomy", id="more-ram-costs-more"),
        pytest.param(30, 50, "big", id="a-bigger-gpu"),
        pytest.param(0, 100, "roomy", id="host-memory-alone"),
    ],
)
def test_the_cheapest_backbone_holds_both_gpu_and_host_bytes(gpu_gb, host_gb, name):
    chosen = cheapest_backbone(gpu_gb * GB, host_gb * GB, BACKBONES)
    assert chosen.name == name
    assert Fleet(chosen, 1).memory_bytes >= gpu_gb * GB and chosen.host_bytes_usable >= host_gb * GB


def test_backbone_ties_go_to_more_bandwidth_then_catalogue_order():
    slow, fast = instance("slow", 24, 1.0, gbps=100), instance("fast", 24, 1.0, gbps=900)
    assert cheapest_backbone(GB, GB, {"slow": slow, "fast": fast}).name == "fast"
    first, second = instance("first", 24, 1.0), instance("second", 24, 1.0)
    assert cheapest_backbone(GB, GB, {"first": first, "second": second}).name == "first"


def test_a_backbone_nothing_holds_is_refused_naming_the_biggest_tried():
    with pytest.raises(CatalogueError, match=r"30\.0 GB on its GPUs and 150\.0 GB in host RAM.*big.*roomy"):
        cheapest_backbone(30 * GB, 150 * GB, BACKBONES)
    with pytest.raises(CatalogueError, match="empty"):
        cheapest_backbone(GB, GB, {})


def test_the_built_in_catalogue_has_a_cheap_node_with_ram_for_a_hybrid_backbone():
    # 20 GB on the GPU and 100 GB in RAM: g6.8xlarge (L4, 128 GiB, $2.0144) beats g5.8xlarge ($2.448)
    # and g6e.4xlarge ($3.00424); g6.4xlarge's 64 GiB is too little
    assert cheapest_backbone(20 * GB, 100 * GB).name == "g6.8xlarge"


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
        pytest.param(
            [{k: v for k, v in GOOD.items() if k != "host_memory_gbps"}],
            r"instance 0 \(x\) lacks host_memory_gbps",
            id="missing-host-bandwidth",
        ),
        pytest.param(
            [{k: v for k, v in GOOD.items() if k not in ("vcpus", "host_source")}],
            r"lacks vcpus, host_source",
            id="missing-host-fields",
        ),
        pytest.param([GOOD | {"vcpus": 0}], "vcpus must be a whole number of at least 1", id="no-vcpus"),
        pytest.param([GOOD | {"host_memory_gb": -1}], "host_memory_gb must be a number above 0", id="no-ram"),
        pytest.param([GOOD | {"host_source": ""}], "host_source must be a non-empty string", id="no-source"),
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
