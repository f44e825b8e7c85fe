"""The README's commands, run as a user's clone would run them, so the README cannot drift from the CLI.

Every command in the README's shell blocks is `make` or `.venv/bin/moeless`. The four walk-throughs
run in order in a scratch folder in a tiny form: a tiny Mixtral stands in for the download, three
prompts and three arrivals for the user's files, a minute of traffic for half an hour, any free
port for 8000; `serve` runs in the background while `invoke` and the Python snippet talk to it.
What needs an AWS account (a deploy, destroy or quota check with `--profile`) has its options
parsed by the CLI itself; so have the commands of the "With the project's data" section, which
alone may name `../shared`.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import chdir
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
MOELESS = ".venv/bin/moeless"
DATA_SECTION = "With the project's data"
WALK_THROUGHS = (
    "1. Package a checkpoint",
    "2. Size a plan for your traffic",
    "3. Run it locally",
    "4. Deploy it",
)
MAX_LINES = 300
# The tiny form: options whose README values would take minutes, and what they become here.
TINY_OPTIONS = {"--duration": "60", "--max-new-tokens": "4", "--port": "0"}
USER_PROMPTS = [
    '{"prompt": "The import statement"}',
    '{"prompt": "A list comprehension"}',
    '{"prompt": "Raise"}',
]
USER_ARRIVALS = "timestamp_s,input_tokens,output_tokens\n0.0,40,8\n5.0,60,12\n9.0,30,6\n"
COMMAND_TIMEOUT_S = 300


@dataclass(frozen=True)
class Block:
    """One fenced code block of the README and the ``###``/``##`` section it sits in."""

    language: str
    code: str
    section: str


def readme_blocks(text: str) -> list[Block]:
    blocks, section = [], ""
    lines = iter(text.splitlines())
    for line in lines:
        if heading := re.match(r"#{2,3} (.+)", line):
            section = heading.group(1).strip()
        elif fence := re.match(r"```(\w*)", line):
            code = []
            for inner in lines:
                if inner.startswith("```"):
                    break
                code.append(inner)
            blocks.append(Block(fence.group(1), "\n".join(code), section))
    return blocks


def shell_commands(code: str) -> list[list[str]]:
    """The argv of each command in a shell block: continuations joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", code)
    return [argv for line in joined.splitlines() if (argv := shlex.split(line, comments=True))]


def commands_of(blocks: list[Block], section: str) -> Iterator[list[str]]:
    for block in blocks:
        if block.section == section and block.language == "bash":
            yield from shell_commands(block.code)


@pytest.fixture(scope="module")
def blocks() -> list[Block]:
    return readme_blocks(README.read_text())


def parse_only(argv: list[str]) -> click.Context:
    """Parse ``moeless ARGS`` as the CLI would, down to the subcommand, without running it."""
    from cli.main import cli

    ctx = cli.make_context("moeless", list(argv))
    command: click.Command = cli
    while isinstance(command, click.Group):
        name, sub, rest = command.resolve_command(ctx, [*ctx._protected_args, *ctx.args])
        assert sub is not None, f"no such command: {name}"
        ctx = sub.make_context(name, rest, parent=ctx)
        command = sub
    return ctx


def needs_aws(argv: list[str]) -> bool:
    return "--profile" in argv


def tiny_form(argv: list[str], endpoint: str | None) -> list[str]:
    out = [str(REPO / MOELESS)]
    args = iter(argv[1:])
    for arg in args:
        out.append(arg)
        if arg in TINY_OPTIONS:
            out.append(TINY_OPTIONS[arg])
            next(args)
        elif arg == "--endpoint":
            assert endpoint, "the README invokes before it serves"
            out.append(endpoint)
            next(args)
    return out


def test_the_readme_is_short_and_names_shared_data_only_in_its_marked_section():
    text = README.read_text()
    assert len(text.splitlines()) <= MAX_LINES
    section = ""
    for line in text.splitlines():
        if heading := re.match(r"#{2,3} (.+)", line):
            section = heading.group(1).strip()
        assert "../shared" not in line or section == DATA_SECTION, f"../shared outside its section: {line}"
    headings = [m.group(1).strip() for m in re.finditer(r"^#{2,3} (.+)$", text, re.M)]
    assert set(WALK_THROUGHS) <= set(headings) and DATA_SECTION in headings


def test_every_readme_command_is_make_or_moeless_and_every_make_target_exists(blocks):
    targets = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M))
    commands = [argv for block in blocks if block.language == "bash" for argv in shell_commands(block.code)]
    assert commands
    for argv in commands:
        assert argv[0] in ("make", MOELESS), f"the README's commands are make or {MOELESS}: {argv}"
        if argv[0] == "make":
            assert set(argv[1:]) <= targets, argv


def test_the_commands_in_the_readmes_prose_parse():
    spans = re.findall(r"`(\.venv/bin/moeless [^`]+)`", README.read_text())
    assert spans
    for span in spans:
        parse_only(shlex.split(span)[1:])


def test_the_project_data_commands_parse(blocks):
    if not (REPO.parent / "shared" / "data").is_dir():
        pytest.skip("../shared/data is not beside this clone (the section's commands need it)")
    commands = list(commands_of(blocks, DATA_SECTION))
    assert commands
    for argv in commands:
        parse_only(argv[1:])


@pytest.mark.slow
def test_the_walk_throughs_run_in_a_tiny_form(blocks, tiny, tmp_path):
    # Given a user's folder: a checkpoint where the README downloads one, their prompts and arrivals.
    shutil.copytree(tiny.model("mixtral"), tmp_path / "models" / "Mixtral-8x7B-v0.1")
    (tmp_path / "my-prompts.jsonl").write_text("\n".join(USER_PROMPTS) + "\n")
    (tmp_path / "my-arrivals.csv").write_text(USER_ARRIVALS)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    server: subprocess.Popen[str] | None = None
    endpoint = None
    try:
        for section in WALK_THROUGHS:
            commands = list(commands_of(blocks, section))
            assert commands, f"no commands under {section!r}"
            for argv in commands:
                assert argv[0] == MOELESS, argv
                if needs_aws(argv):
                    with chdir(tmp_path):  # click checks that named files exist
                        parse_only(argv[1:])
                    continue
                command = tiny_form(argv, endpoint)
                if argv[1] == "serve":
                    server, endpoint = _start(command, tmp_path, env)
                    continue
                done = subprocess.run(
                    command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
                )
                assert done.returncode == 0, (
                    f"{shlex.join(argv)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
                )
            for block in (b for b in blocks if b.section == section and b.language == "python"):
                assert endpoint, "a Python snippet before anything serves"
                code = block.code.replace("http://127.0.0.1:8000", endpoint)
                done = subprocess.run(
                    [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
                )
                assert done.returncode == 0 and done.stdout.strip(), done.stderr[-3000:]
    finally:
        if server is not None:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
    assert server is not None and server.returncode == 0, "serve did not stop cleanly on Ctrl-C"
    assert (tmp_path / "cdk.out" / "manifest.json").is_file()


def _start(command: list[str], cwd: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    """Start ``serve`` and wait for the line that says where it listens."""
    server = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert server.stdout is not None
    seen = []
    for line in server.stdout:
        seen.append(line)
        if found := re.match(r"REST endpoint: (http://127\.0\.0\.1:\d+)/v1", line):
            _drain(server)
            return server, found.group(1)
    raise AssertionError("serve exited before listening:\n" + "".join(seen[-40:]))


def _drain(server: subprocess.Popen[str]) -> None:
    """Keep reading the server's output so a full pipe never blocks it."""
    assert server.stdout is not None
    stream = server.stdout
    threading.Thread(target=lambda: stream.read(), daemon=True).start()


def test_every_relative_link_in_the_readmes_and_docs_names_a_file_that_exists():
    pages = [README, REPO / "benchmarks" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor on the same page
            path = (page.parent / target.split("#", 1)[0]).resolve()
            assert path.exists(), f"{page.relative_to(REPO)} links to {target}, which does not exist"
