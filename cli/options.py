"""Options shared by several commands, defined once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from moeless.aws_limits import DEFAULT_LIMITS, MAX_FUNCTION_MEMORY_MB

F = TypeVar("F", bound=Callable[..., Any])

quiet_option = click.option("--quiet", "-q", is_flag=True, help="No progress bars or step messages.")
plan_option = click.option(
    "--plan",
    "plan_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="plan.json from `moeless plan` [default: one function per expert].",
)

model_option = click.option(
    "--model",
    "model_spec",
    metavar="NAME|CONFIG",
    help="A preset (deepseek-v3...), its HF id, or a config.json [the loads' model].",
)

# the account's Lambda quotas (`plan` and `simulate` hold plans to them, `functions up` enforces the
# first, `deploy` checks the second; defaults: moeless/aws_limits.py)
account_concurrency_option = click.option(
    "--account-concurrency",
    type=click.IntRange(1),
    default=DEFAULT_LIMITS.account_concurrency,
    metavar="N",
    help=f"The account's concurrent executions [{DEFAULT_LIMITS.account_concurrency}].",
)
max_function_memory_option = click.option(
    "--max-function-memory-mb",
    type=click.IntRange(128, MAX_FUNCTION_MEMORY_MB),
    default=MAX_FUNCTION_MEMORY_MB,
    metavar="MB",
    help=f"Function memory cap, MB (new: 3008) [{MAX_FUNCTION_MEMORY_MB}].",
)


def echo_step(message: str, quiet: bool = False) -> None:
    """A progress message, to stderr so stdout stays the command's result."""
    if not quiet:
        click.echo(message, err=True)


def option_group(*options: Callable[[F], F]) -> Callable[[F], F]:
    """One decorator applying ``options`` in the order given (the first is listed first in --help)."""

    def apply(command: F) -> F:
        for option in reversed(options):
            command = option(command)
        return command

    return apply


# what a simulation replays: its requests (`moeless simulate`, `moeless plan --slo-tpot-ms`)
traffic_options = option_group(
    click.option(
        "--arrivals",
        "arrivals_path",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="Trace CSV: timestamp_s, input/output tokens.",
    ),
    click.option(
        "--arrival",
        default="poisson:2",
        metavar="SPEC",
        help="Else poisson:R, bursty:R:PEAK:PERIOD, timestamps:FILE.",
    ),
    click.option(
        "--rate",
        type=click.FloatRange(0, min_open=True),
        metavar="R",
        help="Rescale --arrivals to R requests/s.",
    ),
    click.option(
        "--duration",
        type=click.FloatRange(0, min_open=True),
        default=60.0,
        metavar="S",
        help="Window, s [60].",
    ),
    click.option(
        "--prompt-tokens", type=click.IntRange(1), default=128, metavar="N", help="Without --arrivals [128]."
    ),
    click.option(
        "--output-tokens", type=click.IntRange(1), default=64, metavar="N", help="Without --arrivals [64]."
    ),
    click.option("--seed", type=int, default=0, metavar="N", help="Random seed [0]."),
    click.option(
        "--resample-experts",
        is_flag=True,
        help="Carry the loads' skew to the model's experts.",
    ),
)

# the hardware and serving settings a simulation runs on
deployment_options = option_group(
    click.option(
        "--max-batch", type=click.IntRange(1), default=16, metavar="N", help="Sequences per step [16]."
    ),
    click.option(
        "--prefill-chunk",
        type=click.IntRange(1),
        metavar="N",
        help="Prompt tokens per step [whole prompts].",
    ),
    click.option(
        "--context-tokens",
        type=click.IntRange(1),
        default=8192,
        metavar="N",
        help="KV cache per sequence [8192 tokens].",
    ),
    click.option(
        "--expert-dtype",
        type=click.Choice(["fp32", "fp16", "int8"]),
        default="fp32",
        metavar="DTYPE",
        help="Functions' experts: fp32, fp16, int8 [fp32].",
    ),
    click.option(
        "--gpu-dtype",
        default="native",
        metavar="DTYPE",
        help="GPU weights: native, bf16, fp16, fp8, int8.",
    ),
    click.option(
        "--instances",
        "instances_path",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="Your GPU instance catalogue (JSON).",
    ),
)


# speculative decoding (`simulate`, `plan --slo-tpot-ms`): drafts verified per forward, and how many
# of them are kept (moeless/simulation/speculation.py); `plan` with an acceptance also tries 0 up to
# the positions it covers (docs/planner.md, "Speculative decoding")
speculation_options = option_group(
    click.option(
        "--speculate",
        type=click.IntRange(0),
        default=0,
        metavar="K",
        help="Drafts verified per forward [0: none].",
    ),
    click.option(
        "--draft-acceptance",
        "draft_acceptance_text",
        metavar="A",
        help="Drafts kept: mtp, P, P1,P2,... or stats JSON.",
    ),
)


def draft_acceptance(given: str | None, model: str) -> Any:
    """``--draft-acceptance`` resolved for ``model`` (``None`` where not given; a click error where
    it is none of the forms)."""
    from moeless.errors import SimulationError
    from moeless.simulation.speculation import Acceptance

    if given is None:
        return None
    try:
        return Acceptance.parse(given, model)
    except SimulationError as exc:
        raise click.BadParameter(str(exc), param_hint="--draft-acceptance") from None


api_price_option = click.option(
    "--api-price",
    "api_price_text",
    metavar="IN,OUT",
    help="Hosted API $/M in,out [preset's; none: off].",
)


def api_price(given: str | None, model: str) -> Any:
    """``--api-price`` resolved for ``model`` (a click error where it is not a price)."""
    from moeless.planning.api_prices import api_price_for

    try:
        return api_price_for(given, model)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--api-price") from None
