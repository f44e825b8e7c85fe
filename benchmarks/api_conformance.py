"""The REST endpoint against the clients that meet it: the official openai client, litellm (as
vLLM's ``hosted_vllm`` provider) and schemathesis, on the tiny demo model's service.

    python3 -m venv /tmp/conf-venv && /tmp/conf-venv/bin/pip install litellm schemathesis openai
    .venv/bin/python benchmarks/api_conformance.py --tools /tmp/conf-venv
    .venv/bin/python benchmarks/api_conformance.py --tools /tmp/conf-venv --max-examples 20   # quicker

The service is the demo's tiny Mixtral (built once under .moeless/bench/), its experts on the
local Lambda host, on a free 127.0.0.1 port, as ``moeless serve --local`` runs it, with a
``max_tokens`` limit of 32 so that each generated case is quick on the CPU. litellm and
schemathesis are not project dependencies: they run from the venv ``--tools`` names, the clients
as this file in a child process (``--clients URL MODEL``, which imports nothing of the project),
schemathesis as its CLI on ``/openapi.json`` with every check. Each client call is a check: it
passes when the call succeeds and its answer reads as that client documents it.
Writes benchmarks/results/api_conformance.md: the command, commit, date, machine, versions and findings.
"""

from __future__ import annotations

import argparse
import base64
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
WORKDIR = REPO / ".moeless" / "bench" / "api-conformance"
MAX_TOKENS_LIMIT = 32
CHAT = [{"role": "user", "content": "Name a prime number."}]


# --- the clients (the child process, in the tools venv) ------------------------------------------


def client_checks(url: str, model: str) -> list[tuple[str, str, Callable[[], str]]]:
    """(client, what, call) per check; ``call`` returns a short note or raises."""
    import litellm
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    vllm = {"model": f"hosted_vllm/{model}", "api_base": f"{url}/v1", "api_key": "unused"}

    def openai_completion() -> str:
        answer = client.completions.create(model=model, prompt="Serverless", max_tokens=8, temperature=0)
        assert answer.choices[0].text and answer.usage.completion_tokens >= 1
        return f"{answer.usage.completion_tokens} tokens"

    def openai_completion_stream() -> str:
        chunks = list(
            client.completions.create(
                model=model,
                prompt="Serverless",
                max_tokens=8,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        assert chunks[-1].usage is not None and chunks[-1].choices == []
        return f"{len(chunks)} chunks"

    def openai_completion_logprobs() -> str:
        answer = client.completions.create(model=model, prompt="Serverless", max_tokens=8, logprobs=0)
        logprobs = answer.choices[0].logprobs
        assert logprobs is not None and len(logprobs.token_logprobs) == answer.usage.completion_tokens
        return f"{len(logprobs.token_logprobs)} logprobs"

    def openai_chat() -> str:
        chat = client.chat.completions.create(model=model, messages=CHAT, temperature=0)
        assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens > 16
        return f"{chat.usage.completion_tokens} tokens without max_tokens"

    def openai_chat_stream() -> str:
        chunks = list(
            client.chat.completions.create(model=model, messages=CHAT, max_completion_tokens=8, stream=True)
        )
        assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].choices[0].finish_reason
        return f"{len(chunks)} chunks"

    def openai_chat_logprobs() -> str:
        chat = client.chat.completions.create(
            model=model, messages=CHAT, max_tokens=8, logprobs=True, top_logprobs=0
        )
        content = chat.choices[0].logprobs.content
        assert len(content) == chat.usage.completion_tokens
        return f"{len(content)} logprobs"

    def openai_models() -> str:
        card = client.models.retrieve(model)
        assert [m.id for m in client.models.list()] == [model] and card.max_model_len > 0
        return f"max_model_len {card.max_model_len}"

    def openai_refusal() -> str:
        try:
            client.chat.completions.create(model=model, messages=CHAT, max_tokens=8, n=2)
        except openai.BadRequestError as exc:
            assert exc.body["param"] == "n"
            return exc.body["message"]
        raise AssertionError("n=2 was accepted")

    def litellm_chat() -> str:
        answer = litellm.completion(messages=CHAT, max_tokens=8, temperature=0, **vllm)
        assert answer.choices[0].message.content is not None and answer.usage.completion_tokens >= 1
        return f"{answer.usage.completion_tokens} tokens"

    def litellm_chat_stream() -> str:
        chunks = list(litellm.completion(messages=CHAT, max_tokens=8, stream=True, **vllm))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text
        return f"{len(chunks)} chunks"

    def litellm_text_completion() -> str:
        answer = litellm.text_completion(prompt="Serverless", max_tokens=8, **vllm)
        assert answer.choices[0].text
        return f"{len(answer.choices[0].text)} characters"

    def litellm_defaults() -> str:
        answer = litellm.completion(
            messages=CHAT, max_tokens=4, tool_choice="none", response_format={"type": "text"}, **vllm
        )
        assert answer.choices[0].message.content is not None
        return "tool_choice none, response_format text accepted"

    return [
        ("openai", "completion", openai_completion),
        ("openai", "completion, streamed with usage", openai_completion_stream),
        ("openai", "completion, logprobs 0", openai_completion_logprobs),
        ("openai", "chat, default length", openai_chat),
        ("openai", "chat, streamed", openai_chat_stream),
        ("openai", "chat, logprobs, top_logprobs 0", openai_chat_logprobs),
        ("openai", "models list and retrieve", openai_models),
        ("openai", "n=2 refused naming n", openai_refusal),
        ("litellm", "hosted_vllm chat", litellm_chat),
        ("litellm", "hosted_vllm chat, streamed", litellm_chat_stream),
        ("litellm", "hosted_vllm text completion", litellm_text_completion),
        ("litellm", "hosted_vllm chat with neutral tool_choice and response_format", litellm_defaults),
    ]


def run_clients(url: str, model: str) -> list[dict[str, str]]:
    """Every check, one result each (a failure is recorded, never raised)."""
    results = []
    for client, what, call in client_checks(url, model):
        try:
            results.append({"client": client, "check": what, "ok": "yes", "note": call()})
        except Exception as exc:
            results.append(
                {"client": client, "check": what, "ok": "no", "note": f"{type(exc).__name__}: {exc}"}
            )
    return results


# --- the service and the report (this process, the project's venv) --------------------------------


def versions(python: Path) -> dict[str, str]:
    script = (
        "import importlib.metadata as m, json;"
        "print(json.dumps({p: m.version(p) for p in ('openai', 'litellm', 'schemathesis')}))"
    )
    return json.loads(
        subprocess.run([python, "-c", script], capture_output=True, text=True, check=True).stdout
    )


def schemathesis_args(url: str, max_examples: int, seed: int, report: Path) -> list[str]:
    """schemathesis' CLI on the service's document, every check, one worker, an ndjson report."""
    return [
        "run",
        f"{url}/openapi.json",
        "--checks",
        "all",
        "--max-examples",
        str(max_examples),
        "--seed",
        str(seed),
        "--workers",
        "1",
        "--no-color",
        "--report",
        "ndjson",
        "--report-ndjson-path",
        str(report),
    ]


def run_schemathesis(tools: Path, url: str, max_examples: int, seed: int, report: Path) -> dict[str, Any]:
    """The run, its exit status, time, output and summary."""
    command = [str(tools / "bin" / "schemathesis"), *schemathesis_args(url, max_examples, seed, report)]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=report.parent)
    return {
        "settings": (max_examples, seed, Path(report.name)),
        "exit": done.returncode,
        "seconds": time.perf_counter() - started,
        "output": done.stdout + done.stderr,
        "summary": summarise_ndjson(report),
    }


def summarise_ndjson(path: Path) -> dict[str, Any]:
    """Cases run, and each failure (operation: check, the request body and the answer) from
    schemathesis' ndjson events; ``known``: a schema-valid prompt refused as longer than the
    context, which no schema can say (docs/serving.md), ``failures``: the others."""
    cases, operations, found = 0, set(), {"failures": {}, "known": {}}
    for line in path.read_text().splitlines() if path.is_file() else []:
        recorder = json.loads(line).get("ScenarioFinished", {}).get("recorder")
        if recorder is None:
            continue
        if " /" in recorder["label"]:  # "POST /tokenize"; not a stateful scenario's label
            operations.add(recorder["label"])
        cases += len(recorder.get("cases") or {})
        for case_id, checks in (recorder.get("checks") or {}).items():
            for check in checks:
                if check["status"] != "success":
                    exchange = _exchange((recorder.get("interactions") or {}).get(case_id) or {})
                    kind = "known" if "context_length_exceeded" in exchange else "failures"
                    found[kind].setdefault(f"{recorder['label']}: {check['name']}", exchange)
    return {"operations": len(operations), "cases": cases, **found}


def _exchange(interaction: dict[str, Any]) -> str:
    """``request body -> status answer``, each cut to 300 characters."""

    def text(body: Any) -> str:
        raw = base64.b64decode(body["$base64"]).decode(errors="replace") if isinstance(body, dict) else ""
        return raw[:300]

    request, response = interaction.get("request") or {}, interaction.get("response") or {}
    return f"`{text(request.get('body'))}` -> {response.get('status_code')} `{text(response.get('content'))}`"


def write_report(argv: list[str], tools: Path, clients: list[dict[str, str]], fuzz: dict[str, Any]) -> None:
    """benchmarks/results/api_conformance.md (``common.write_result``), printed too."""
    from common import write_result

    summary = fuzz["summary"]
    passed = sum(r["ok"] == "yes" for r in clients)
    tool_versions = ", ".join(
        f"{name} {version}" for name, version in versions(tools / "bin" / "python").items()
    )
    lines = [
        f"{tool_versions} (from `{tools}`).",
        "",
        f"The tiny demo Mixtral served on 127.0.0.1 with its experts on the local Lambda host, "
        f"`max_tokens` limit {MAX_TOKENS_LIMIT}.",
        "",
        f"## Clients: {passed} of {len(clients)} checks pass",
        "",
        "| client | check | passes | note |",
        "|---|---|---|---|",
        *(
            f"| {r['client']} | {r['check']} | {r['ok']} | {r['note'].replace('|', '/')[:200]} |"
            for r in clients
        ),
        "",
        f"## schemathesis: {summary['cases']} cases on {summary['operations']} operations, "
        f"{len(summary['failures'])} failing checks (exit {fuzz['exit']}, {fuzz['seconds']:.0f} s)",
        "",
        f"`schemathesis {' '.join(schemathesis_args('http://127.0.0.1:PORT', *fuzz['settings']))}`",
        "",
        *(f"- {failure}: {exchange}" for failure, exchange in summary["failures"].items()),
        "" if summary["failures"] else "No check failed.",
        "",
        "Known, not counted: a schema-valid prompt refused as longer than the model's context, which no "
        "schema can say (docs/serving.md):"
        if summary["known"]
        else "",
        "",
        *(f"- {failure}: {exchange}" for failure, exchange in summary["known"].items()),
        "",
        "Its closing lines:",
        "",
        "```",
        *fuzz["output"].strip().splitlines()[-12:],
        "```",
    ]
    print("\n".join(lines))
    write_result("api_conformance", "the REST endpoint against openai, litellm and schemathesis", lines, argv)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tools", type=Path, help="the venv holding openai, litellm and schemathesis")
    parser.add_argument(
        "--max-examples", type=int, default=50, help="schemathesis cases per operation and phase"
    )
    parser.add_argument("--seed", type=int, default=1, help="schemathesis' random seed")
    parser.add_argument("--clients", nargs=2, metavar=("URL", "MODEL"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.clients:  # the child, in the tools venv
        print(json.dumps(run_clients(*args.clients)))
        return 0
    if args.tools is None or not (args.tools / "bin" / "schemathesis").is_file():
        parser.error("--tools must name a venv with openai, litellm and schemathesis installed")

    sys.path.insert(0, str(REPO / "benchmarks"))
    from common import tiny_mixtral

    from backbone_service.local import running_service
    from moeless.contracts.manifest import load_manifest
    from moeless.contracts.plan import one_function_per_expert
    from moeless.lambda_host.experts import start_expert_host
    from moeless.serving.backbone import BackboneConfig

    _, artifacts = tiny_mixtral(WORKDIR)
    plan = one_function_per_expert(load_manifest(artifacts))
    config = BackboneConfig(artifacts, max_tokens_limit=MAX_TOKENS_LIMIT, replan_interval_s=0, device="cpu")
    expert_root = REPO / "functions" / "expert"
    with (
        running_service(config, 0, lambda: start_expert_host(artifacts, plan, expert_root)) as (
            server,
            backbone,
            _,
        ),
        tempfile.TemporaryDirectory() as scratch,
    ):
        child = subprocess.run(
            [str(args.tools / "bin" / "python"), __file__, "--clients", server.url, backbone.model_name],
            capture_output=True,
            text=True,
        )
        if child.returncode != 0:
            sys.exit(f"the clients' process failed:\n{child.stderr[-4000:]}")
        clients = json.loads(child.stdout.strip().splitlines()[-1])
        fuzz = run_schemathesis(
            args.tools, server.url, args.max_examples, args.seed, Path(scratch) / "events.ndjson"
        )
    write_report(argv, args.tools, clients, fuzz)
    return 0 if all(r["ok"] == "yes" for r in clients) and not fuzz["summary"]["failures"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
