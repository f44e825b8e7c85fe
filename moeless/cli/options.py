"""Options shared by several commands, defined once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

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
    help="The model's shape: a preset (mixtral-8x7b, gpt-oss-120b, deepseek-v3...), a Hugging Face id "
    "of one, or a config.json [default: the model the loads name].",
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
        help="Replay a recorded trace: CSV of timestamp_s,input_tokens,output_tokens "
        "(each request keeps its lengths).",
    ),
    click.option(
        "--arrival",
        default="poisson:2",
        show_default=True,
        help="Without --arrivals: poisson:RATE, bursty:RATE:PEAK:PERIOD (requests per second) "
        "or timestamps:FILE.",
    ),
    click.option(
        "--rate",
        type=click.FloatRange(0, min_open=True),
        help="With --arrivals: rescale the timestamps to this mean rate (requests/s), keeping the "
        "burst shape.",
    ),
    click.option("--duration", type=click.FloatRange(0, min_open=True), default=60.0, show_default=True),
    click.option(
        "--prompt-tokens",
        type=click.IntRange(1),
        default=128,
        show_default=True,
        help="With --loads and no --arrivals.",
    ),
    click.option(
        "--output-tokens",
        type=click.IntRange(1),
        default=64,
        show_default=True,
        help="With --loads and no --arrivals.",
    ),
    click.option("--seed", type=int, default=0, show_default=True),
    click.option(
        "--resample-experts",
        is_flag=True,
        help="Loads recorded on a model with another expert count: carry each layer's skew onto "
        "the model's experts.",
    ),
)

# the hardware and serving settings a simulation runs on
deployment_options = option_group(
    click.option(
        "--max-batch", type=click.IntRange(1), default=16, show_default=True, help="Sequences per step."
    ),
    click.option(
        "--prefill-chunk",
        type=click.IntRange(1),
        help="Chunked prefill: prompt tokens an engine step computes, shared by its new sequences "
        "(bounds the stall a long prompt puts on the decoding batch). Default: each prompt whole.",
    ),
    click.option(
        "--context-tokens",
        type=click.IntRange(1),
        default=8192,
        show_default=True,
        help="KV cache each batched sequence is sized for (the fleet and the backbone must hold it).",
    ),
    click.option(
        "--expert-dtype",
        type=click.Choice(["fp32", "fp16", "int8"]),
        default="fp32",
        show_default=True,
        help="The functions' experts: sets their bytes, CPU time and cold start.",
    ),
    click.option(
        "--gpu-dtype",
        default="native",
        show_default=True,
        help="Weights on the GPUs: native (the published checkpoint's), bf16, fp16, fp8, int8.",
    ),
    click.option(
        "--instances",
        "instances_path",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="Your own GPU instance catalogue (JSON) instead of the built-in on-demand prices.",
    ),
)
