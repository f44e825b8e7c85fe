"""The hosted-API reference price: each preset's sourced and dated, or none; a user's IN,OUT read or
refused clearly; and what requests would have cost there per 1k."""

from __future__ import annotations

import re

import pytest

from moeless.model.shapes import PRESETS
from moeless.planning.api_prices import API_PRICES, ApiPrice, parse_api_price, usd_per_1k_requests


def test_every_preset_is_priced_with_a_dated_source_or_has_none():
    assert set(API_PRICES) == set(PRESETS)
    for name, price in API_PRICES.items():
        if price is None:
            continue
        assert price.input_usd_per_m > 0 and price.output_usd_per_m > 0, name
        assert re.search(r"\b20\d\d-\d\d-\d\d\b", price.source), name
    # no hosted API prices these two with a source here: none, not a guess
    assert API_PRICES["olmoe-1b-7b"] is None and API_PRICES["switch-base-128"] is None
    deepseek = API_PRICES["deepseek-v3"]
    assert deepseek is not None and (deepseek.input_usd_per_m, deepseek.output_usd_per_m) == (0.27, 1.10)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("0.27,1.10", (0.27, 1.10), id="plain"),
        pytest.param(" 0.5 , 2 ", (0.5, 2.0), id="spaces"),
        pytest.param("0,0", (0.0, 0.0), id="free"),
    ],
)
def test_a_users_price_is_read(text, expected):
    price = parse_api_price(text)
    assert (price.input_usd_per_m, price.output_usd_per_m) == expected and price.source


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("", "IN,OUT", id="empty"),
        pytest.param("0.27", "IN,OUT", id="one-number"),
        pytest.param("1,2,3", "IN,OUT", id="three-numbers"),
        pytest.param("1;2", "IN,OUT", id="wrong-separator"),
        pytest.param("cheap,2", "IN,OUT", id="not-a-number"),
        pytest.param("-1,2", "at least 0", id="negative"),
        pytest.param("nan,2", "at least 0", id="nan"),
        pytest.param("1,inf", "at least 0", id="infinite"),
    ],
)
def test_a_malformed_price_is_refused_quoting_it(text, message):
    with pytest.raises(ValueError, match=message) as info:
        parse_api_price(text)
    assert repr(text) in str(info.value)


def test_the_cost_per_1k_requests():
    # 1,000 requests of 1,000 prompt and 200 generated tokens at $0.27 / $1.10 per M:
    # $0.27 for the prompts + $0.22 for the output, over 1k requests
    price = ApiPrice(0.27, 1.10, "hand")
    assert usd_per_1k_requests(price, 1_000_000, 200_000, 1_000) == pytest.approx(0.49)
    # 10 requests, 5,000 prompt and 1,000 output tokens in all, at $1 / $2: $0.007 -> $0.70 per 1k
    assert usd_per_1k_requests(ApiPrice(1.0, 2.0, "hand"), 5_000, 1_000, 10) == pytest.approx(0.7)
    assert usd_per_1k_requests(price, 0, 0, 5) == 0.0
