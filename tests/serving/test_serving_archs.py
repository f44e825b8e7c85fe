"""Every supported architecture served through the backbone service with experts on the local
Lambda host: 8 concurrent greedy requests give exactly ``generate``'s tokens on the unsplit model."""

from __future__ import annotations

import pytest

from moeless.model.tiny import TINY_ARCHS
from tests.serving.test_serving import PROMPTS, engine_ids, reference_ids, serving


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_served_tokens_equal_generate(tiny, arch):
    expected = reference_ids(tiny.model(arch), PROMPTS, 6)
    with serving(tiny.package(arch)) as (_, backbone, host):
        assert engine_ids(backbone, PROMPTS, 6) == expected
        assert backbone.stats.get("fallbacks") == 0 and backbone.stats.get("invokes") > 0
        assert host.meter.snapshot()["totals"]["requests"] == backbone.stats.get("invokes")
