"""What the same requests would cost on a hosted API: the reference price a self-hosted deployment
has to beat, in USD per million input and output tokens, for each preset model that has one.

Each price is a public list price with its source and the date it was read or published; a preset no
hosted API prices with a source here (OLMoE, Switch) has ``None``, never a guess. Prices move (DeepSeek
repointed ``deepseek-chat`` from V3 to later models at other prices): re-check before quoting, or pass
your own with :func:`parse_api_price`. Input is charged at the full rate (no prompt-cache discount),
which is what a request with a new prompt pays.

* deepseek-v3: DeepSeek's own API, ``deepseek-chat`` = DeepSeek-V3, its standard price from
  2025-02-08 (after the launch discount), cache-miss input: api-docs.deepseek.com "Models & Pricing"
  (pricing-details-usd, a stored copy listing deepseek-chat 64K context: $0.27 in / $1.10 out).
* mixtral-8x7b, gpt-oss-120b, gpt-oss-20b: AWS Bedrock on-demand (Mixtral 8x7B Instruct,
  gpt-oss-120b, gpt-oss-20b), from github.com/pydantic/genai-prices ``prices/providers/aws.yml``
  (commit 0090b412, transcribed from aws.amazon.com/bedrock/pricing), read 2026-12-05. gpt-oss-120b's
  $0.15/$0.60 is also Groq's, checked against groq.com/pricing on 2026-07-04
  (github.com/Helicone/helicone/pull/5709), where gpt-oss-20b is $0.075/$0.30 (Bedrock's $0.07 here).
* qwen3-235b-a22b: Fireworks' launch price of Qwen3-235B-A22B (the April 2025 model, not the 2507
  update), fireworks.ai/pricing as quoted in github.com/WorkflowAI/WorkflowAI/pull/230 (2025-04-30).
* qwen3-30b-a3b: OpenRouter's listed rate for qwen/qwen3-30b-a3b, from github.com/anomalyco/models.dev
  ``providers/openrouter/models/qwen/qwen3-30b-a3b.toml`` (commit 39b09c42), read 2026-12-05; the
  entry carries no date of its own, and OpenRouter's rate is that of the provider it routes to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["API_PRICES", "ApiPrice", "parse_api_price", "usd_per_1k_requests"]


@dataclass(frozen=True)
class ApiPrice:
    """A hosted API's list price, USD per million tokens."""

    input_usd_per_m: float
    output_usd_per_m: float
    source: str  # where the price comes from, with its date


_BEDROCK = (
    "AWS Bedrock on-demand, via github.com/pydantic/genai-prices prices/providers/aws.yml "
    "(commit 0090b412, from aws.amazon.com/bedrock/pricing), read 2026-12-05"
)

# every preset of moeless.model.shapes.PRESETS, priced or None
API_PRICES: dict[str, ApiPrice | None] = {
    "mixtral-8x7b": ApiPrice(0.45, 0.70, f"Mixtral 8x7B Instruct on {_BEDROCK}"),
    "olmoe-1b-7b": None,
    "gpt-oss-20b": ApiPrice(0.07, 0.30, f"gpt-oss-20b on {_BEDROCK}"),
    "gpt-oss-120b": ApiPrice(
        0.15,
        0.60,
        f"gpt-oss-120b on {_BEDROCK}; the same on groq.com/pricing, checked 2026-07-04 "
        "(github.com/Helicone/helicone/pull/5709)",
    ),
    "qwen3-30b-a3b": ApiPrice(
        0.06,
        0.22,
        "OpenRouter qwen/qwen3-30b-a3b, via github.com/anomalyco/models.dev "
        "providers/openrouter/models/qwen/qwen3-30b-a3b.toml (commit 39b09c42), read 2026-12-05",
    ),
    "qwen3-235b-a22b": ApiPrice(
        0.22,
        0.88,
        "Fireworks Qwen3-235B-A22B, fireworks.ai/pricing as quoted in "
        "github.com/WorkflowAI/WorkflowAI/pull/230 (2025-04-30)",
    ),
    "deepseek-v3": ApiPrice(
        0.27,
        1.10,
        "DeepSeek API deepseek-chat (DeepSeek-V3), cache-miss input, standard price from 2025-02-08: "
        "api-docs.deepseek.com/quick_start/pricing-details-usd",
    ),
    "switch-base-128": None,
}


def parse_api_price(text: str, source: str = "given by the user") -> ApiPrice:
    """``"IN,OUT"`` (USD per million input and output tokens, e.g. ``"0.27,1.10"``) as an :class:`ApiPrice`.

    Raises:
        ValueError: not two finite numbers of at least 0 separated by one comma (the message quotes
            the text and says what is expected, fit for a command-line error).
    """
    try:
        input_usd, output_usd = map(float, text.split(","))  # a count other than 2 is a ValueError too
    except ValueError:
        raise ValueError(
            f"{text!r} is not an API price: give USD per million input and output tokens as IN,OUT "
            "(e.g. 0.27,1.10)"
        ) from None
    if not all(math.isfinite(v) and v >= 0 for v in (input_usd, output_usd)):
        raise ValueError(f"{text!r} is not an API price: both figures must be numbers of at least 0")
    return ApiPrice(input_usd, output_usd, source)


def usd_per_1k_requests(
    price: ApiPrice, prompt_tokens_total: float, output_tokens_total: float, requests: int
) -> float:
    """What ``requests`` requests with these token totals (prompts, generated tokens) would have cost
    on the API, per 1,000 requests."""
    assert requests > 0 and prompt_tokens_total >= 0 and output_tokens_total >= 0, (
        requests,
        prompt_tokens_total,
        output_tokens_total,
    )
    usd = (prompt_tokens_total * price.input_usd_per_m + output_tokens_total * price.output_usd_per_m) / 1e6
    return usd / requests * 1e3


def api_price_for(given: str | None, model: str) -> ApiPrice | None:
    """The reference price of a report: ``given`` (``IN,OUT``, or ``none`` for no line), else the
    preset ``model``'s from :data:`API_PRICES`, else none.

    Raises:
        ValueError: ``given`` is not a price (see :func:`parse_api_price`).
    """
    if given is None:
        return API_PRICES.get(model)
    if given.strip().lower() == "none":
        return None
    return parse_api_price(given)
