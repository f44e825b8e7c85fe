"""``moeless invoke``: one completion from a running endpoint (local or API Gateway)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import click


@click.command()
@click.argument("prompt")
@click.option(
    "--endpoint",
    default="http://127.0.0.1:8000",
    show_default=True,
    help="Base URL of the service (without /v1).",
)
@click.option("--model", help="Model name [default: the one the endpoint serves].")
@click.option("--max-tokens", type=click.IntRange(1), default=32, show_default=True)
@click.option("--temperature", type=click.FloatRange(0, 2), default=0.0, show_default=True)
@click.option("--api-key", envvar="MOELESS_API_KEY", help="Sent as x-api-key (API Gateway's usage plan).")
@click.option("--stream/--no-stream", default=True, show_default=True, help="Print tokens as they arrive.")
def invoke(
    prompt: str,
    endpoint: str,
    model: str | None,
    max_tokens: int,
    temperature: float,
    api_key: str | None,
    stream: bool,
) -> None:
    """Complete PROMPT with the model at ENDPOINT and print the text."""
    base = endpoint.rstrip("/").removesuffix("/v1")
    headers = {"Content-Type": "application/json"} | ({"x-api-key": api_key} if api_key else {})
    if model is None:
        model = _get_json(f"{base}/v1/models", headers)["data"][0]["id"]
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": stream,
    }
    request = urllib.request.Request(f"{base}/v1/completions", json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            if not stream:
                answer = json.load(response)
                click.echo(answer["choices"][0]["text"])
                click.echo(f"[{answer['choices'][0]['finish_reason']}, {answer['usage']}]", err=True)
                return
            for line in response:
                data = line.decode().strip().removeprefix("data: ")
                if not data or data == "[DONE]":
                    continue
                chunk = json.loads(data)
                if "error" in chunk:
                    raise click.ClickException(chunk["error"]["message"])
                click.echo(chunk["choices"][0]["text"], nl=False)
            click.echo()
    except urllib.error.HTTPError as exc:
        raise click.ClickException(f"{exc.code}: {_reason(exc)}") from None
    except urllib.error.URLError as exc:
        raise click.ClickException(f"cannot reach {base}: {exc.reason}") from None


def _get_json(url: str, headers: dict[str, str]) -> dict:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as response:
            return json.load(response)
    except urllib.error.HTTPError as exc:
        raise click.ClickException(f"{exc.code}: {_reason(exc)}") from None
    except urllib.error.URLError as exc:
        raise click.ClickException(f"cannot reach {url}: {exc.reason}") from None


def _reason(error: urllib.error.HTTPError) -> str:
    try:
        return json.loads(error.read())["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return str(error.reason)
