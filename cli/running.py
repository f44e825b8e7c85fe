"""What the long-running commands (``functions up``, ``serve``) share: host options, where the
expert handler is, and waiting for Ctrl-C or SIGTERM."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import click

from cli.options import option_group
from moeless.checkout import EXPERT_TASK_ROOT
from moeless.contracts.environment import ALIAS


def expert_task_root(task_root: Path | None) -> Path:
    """The expert handler's folder: ``--task-root``, else ``functions/expert`` of this checkout."""
    root = task_root or EXPERT_TASK_ROOT
    if not (root / "handler.py").is_file():
        raise click.ClickException(f"no expert handler at {root}/handler.py: pass --task-root")
    return root


def wait_for_stop_signal() -> None:
    """Block until SIGINT or SIGTERM (also when the shell started us with SIGINT ignored)."""
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()


# options of the local Lambda host, shared by ``functions up`` and ``serve --local``
host_options = option_group(
    click.option(
        "--alias",
        default=ALIAS,
        show_default=True,
        help="Qualifier that carries provisioned concurrency (and that the backbone invokes).",
    ),
    click.option(
        "--max-instances",
        type=click.IntRange(1),
        default=64,
        show_default=True,
        help="Function instances alive at once, all functions together (this machine's process limit).",
    ),
    click.option(
        "--idle-timeout",
        type=click.FloatRange(0.1),
        default=300.0,
        show_default=True,
        help="Seconds before an idle on-demand instance is stopped.",
    ),
    click.option(
        "--timeout",
        type=click.FloatRange(0.1),
        default=30.0,
        show_default=True,
        help="Function timeout in seconds.",
    ),
    click.option(
        "--log-dir",
        type=click.Path(file_okay=False, path_type=Path),
        help="Keep each instance's log stream here [default: a temporary folder].",
    ),
    click.option(
        "--meter-out",
        type=click.Path(dir_okay=False, path_type=Path),
        help="Also write the final bill as JSON to this file.",
    ),
    click.option(
        "--task-root",
        type=click.Path(exists=True, file_okay=False, path_type=Path),
        help="Folder of the expert handler [default: functions/expert of this checkout].",
    ),
)
