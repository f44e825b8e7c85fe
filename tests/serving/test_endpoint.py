"""The OpenAI endpoint as outside clients meet it: chat completions with the official client,
token-id prompts, cancellation on hang-up, limits, strict validation, error shapes, OpenAPI.

Each defect found by outside tools (issue 17) has a test here that failed before its fix.
"""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.lambda_helpers import wait_for
from tests.serving.test_serving import serving

CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a prime number."},
]


@pytest.fixture(scope="module")
def artifacts(tiny):
    return tiny.package("mixtral")


@pytest.fixture(scope="module")
def service(artifacts):
    with serving(artifacts, max_tokens_limit=256) as running:
        yield running


@pytest.fixture()
def client(service):
    return openai.OpenAI(base_url=f"{service[0]}/v1", api_key="unused", max_retries=0)


def post(url: str, path: str, body: object, **kwargs) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    return httpx.post(f"{url}{path}", content=content, headers=headers, timeout=60, **kwargs)


# --- chat completions, models, token-id prompts -------------------------------------------------


def test_chat_completion_is_the_completion_of_the_templated_prompt(service, client):
    _, backbone, _ = service
    from moeless.model.chat_template import render_chat

    chat = client.chat.completions.create(
        model=backbone.model_name, messages=CHAT, max_completion_tokens=12, temperature=0
    )
    prompt = render_chat(backbone.tokenizer, CHAT)
    assert prompt.endswith("<|assistant|>\n") and "<|system|>\nYou are terse.\n" in prompt
    plain = client.completions.create(model=backbone.model_name, prompt=prompt, max_tokens=12, temperature=0)
    assert chat.object == "chat.completion" and chat.id.startswith("chatcmpl-")
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content == plain.choices[0].text
    assert chat.choices[0].finish_reason == plain.choices[0].finish_reason
    assert chat.usage.completion_tokens == plain.usage.completion_tokens
    assert chat.usage.prompt_tokens == len(backbone.encode(prompt, add_special_tokens=False))


def test_streamed_chat_has_role_then_deltas_then_finish_and_usage(service, client):
    _, backbone, _ = service
    whole = client.chat.completions.create(
        model=backbone.model_name, messages=CHAT, max_tokens=10, temperature=0
    )
    chunks = list(
        client.chat.completions.create(
            model=backbone.model_name,
            messages=CHAT,
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == whole.usage.model_dump()
    assert all(c.usage is None for c in chunks[:-1])


def test_streamed_completion_honours_include_usage(service, client):
    _, backbone, _ = service
    plain = list(client.completions.create(model=backbone.model_name, prompt="A", max_tokens=6, stream=True))
    assert all(c.choices for c in plain)  # no usage chunk unless asked for
    chunks = list(
        client.completions.create(
            model=backbone.model_name,
            prompt="A",
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1
    assert chunks[-1].usage.prompt_tokens == len(backbone.encode("A"))


def test_chat_options_stop_seed_and_a_bad_role(service, client):
    _, backbone, _ = service
    first, second = (
        client.chat.completions.create(
            model=backbone.model_name, messages=CHAT, max_tokens=8, temperature=1.0, top_p=0.9, seed=3
        )
        for _ in range(2)
    )
    assert first.choices[0].message.content == second.choices[0].message.content
    text = (
        client.chat.completions.create(model=backbone.model_name, messages=CHAT, max_tokens=16, temperature=0)
        .choices[0]
        .message.content
    )
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    cut = client.chat.completions.create(
        model=backbone.model_name, messages=CHAT, max_tokens=16, temperature=0, stop=stop
    )
    assert (
        cut.choices[0].message.content == text[: text.find(stop)] and cut.choices[0].finish_reason == "stop"
    )
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\]\.role: Input should be 'system'"):
        client.chat.completions.create(
            model=backbone.model_name, messages=[{"role": "robot", "content": "x"}]
        )


def test_token_id_prompts_equal_their_text(service, client):
    _, backbone, _ = service
    texts = ["The quick brown fox", "Serverless"]
    ids = [backbone.encode(t) for t in texts]
    by_text = client.completions.create(model=backbone.model_name, prompt=texts, max_tokens=6, temperature=0)
    by_ids = client.completions.create(model=backbone.model_name, prompt=ids, max_tokens=6, temperature=0)
    one = client.completions.create(model=backbone.model_name, prompt=ids[0], max_tokens=6, temperature=0)
    assert [c.text for c in by_ids.choices] == [c.text for c in by_text.choices]
    assert one.choices[0].text == by_text.choices[0].text
    with pytest.raises(openai.BadRequestError, match="vocabulary"):
        client.completions.create(model=backbone.model_name, prompt=[backbone.vocab_size], max_tokens=2)


def test_models_by_id(service, client):
    _, backbone, _ = service
    assert client.models.retrieve(backbone.model_name).id == backbone.model_name
    assert [m.id for m in client.models.list()] == [backbone.model_name]
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("nope")
    assert info.value.body["code"] == "model_not_found"


# --- defect 1: a client that hangs up is cancelled ------------------------------------------------


def _send_and_hang_up(url: str, body: dict, read_bytes: int) -> None:
    """POST ``body`` on a raw socket, read ``read_bytes`` of the answer (0: none), close."""
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    with socket.create_connection((host, int(port))) as sock:
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        )
        sock.sendall(head.encode() + payload)
        received = b""
        while len(received) < read_bytes:
            received += sock.recv(4096)
        if not read_bytes:
            time.sleep(0.5)  # generation is under way


@pytest.mark.parametrize("stream, read_bytes", [(True, 600), (False, 0)], ids=["streamed", "plain"])
def test_a_client_that_hangs_up_is_cancelled_with_its_invokes(service, stream, read_bytes):
    url, backbone, host = service
    cancelled = backbone.stats.get("requests_cancelled")
    body = {
        "model": backbone.model_name,
        "prompt": "Hello",
        "max_tokens": 250,
        "temperature": 0,
        "stream": stream,
    }
    _send_and_hang_up(url, body, read_bytes)
    # the sequence leaves the engine at the next step boundary, long before its 250 tokens
    wait_for(lambda: backbone.engine.load() == (0, 0), timeout=60.0)
    assert backbone.stats.get("requests_cancelled") == cancelled + 1  # not "completed"
    invokes = host.meter.snapshot()["totals"]["requests"]
    time.sleep(0.3)
    assert host.meter.snapshot()["totals"]["requests"] == invokes  # no invoke billed after it


# --- defects 2 and 3: refused requests, limits, the event loop ------------------------------------


def test_a_refused_request_leaves_nothing_running(artifacts):
    with serving(artifacts, max_batch=1, max_waiting=2) as (url, backbone, _):
        body = {"model": backbone.model_name, "prompt": ["a", "b", "c"], "max_tokens": 50}
        response = post(url, "/v1/completions", body)
        assert response.status_code == 429 and response.json()["error"]["code"] == "overloaded"
        assert backbone.engine.load() == (0, 0)
        assert backbone.stats.get("requests_rejected") == 1
        assert post(url, "/v1/completions", body | {"prompt": ["a", "b"], "max_tokens": 2}).status_code == 200


def test_prompt_list_and_body_size_limits(service):
    url, backbone, _ = service
    many = post(url, "/v1/completions", {"model": backbone.model_name, "prompt": ["x"] * 17, "max_tokens": 1})
    assert many.status_code == 400 and "at most 16" in many.json()["error"]["message"]
    big = {"model": backbone.model_name, "prompt": "a" * (backbone.config.max_body_bytes + 1)}
    for path in ("/v1/completions", "/v1/chat/completions"):
        response = post(url, path, big)
        assert response.status_code == 413, path
        assert response.json()["error"]["code"] == "request_too_large"

    def chunked():  # no Content-Length: the limit holds while reading
        for _ in range(40):
            yield b"a" * 65536

    response = httpx.post(
        f"{url}/v1/completions", content=chunked(), headers={"Content-Type": "application/json"}, timeout=60
    )
    assert response.status_code == 413
    assert backbone.engine.load() == (0, 0)


def test_tokenising_a_large_prompt_does_not_block_the_event_loop(service):
    url, backbone, _ = service
    prompt = "hello world, this is a test. " * 30000  # ~900 KB: seconds of tokenising, then refused
    body = {"model": backbone.model_name, "prompt": prompt, "max_tokens": 1}
    with ThreadPoolExecutor(1) as pool:
        started = time.perf_counter()
        big = pool.submit(post, url, "/v1/completions", body)
        time.sleep(0.3)
        health = httpx.get(f"{url}/healthz", timeout=30)
        answered = time.perf_counter() - started
        assert health.status_code == 200
        assert not big.done(), f"healthz waited for the tokeniser ({answered:.2f} s)"
        assert big.result().status_code == 400


# --- defects 4 and 5: bad inputs, error shapes ----------------------------------------------------

BAD_INPUTS = [
    pytest.param(b'{"model": "MODEL", "prompt": "x", "seed": 18446744073709551616}', "seed", id="huge-seed"),
    pytest.param(b'{"model": "MODEL", "prompt": "a\\ud800b"}', "surrogate", id="lone-surrogate"),
    pytest.param(
        b'{"model": "MODEL", "prompt": "x", "user": ' + b"[" * 100000 + b"]" * 100000 + b"}",
        "nested",
        id="deep-nesting",
    ),
    pytest.param({"max_tokens": "3"}, "max_tokens", id="max-tokens-string"),
    pytest.param({"max_tokens": True}, "max_tokens", id="max-tokens-bool"),
    pytest.param({"max_tokens": 2.5}, "max_tokens", id="max-tokens-fraction"),
    pytest.param({"stream": "true"}, "stream", id="stream-string"),
    pytest.param({"frequency_penalty": False}, "frequency_penalty", id="penalty-bool"),
    pytest.param({"logprobs": -3}, "logprobs", id="logprobs-negative"),
    pytest.param({"stop": ""}, "stop", id="stop-empty"),
    pytest.param(
        {"stream_options": {"include_usage": "yes"}, "stream": True}, "stream_options", id="usage-str"
    ),
]


@pytest.mark.parametrize("content, needle", BAD_INPUTS)
def test_bad_inputs_are_400_in_openai_shape_and_counted(service, content, needle):
    url, backbone, _ = service
    if isinstance(content, dict):
        content = json.dumps({"model": "MODEL", "prompt": "x"} | content).encode()
    content = content.replace(b'"MODEL"', json.dumps(backbone.model_name).encode())
    before = backbone.stats.get("requests_invalid")
    response = post(url, "/v1/completions", content)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and needle in error["message"], error
    assert backbone.stats.get("requests_invalid") == before + 1
    assert 'moeless_requests_total{outcome="invalid"}' in httpx.get(f"{url}/metrics").text


@pytest.mark.parametrize(
    "method, path, status",
    [("GET", "/v1/nothing", 404), ("GET", "/v1/completions", 405), ("DELETE", "/v1/chat/completions", 405)],
)
def test_unknown_paths_and_methods_answer_in_openai_shape(service, method, path, status):
    url, _, _ = service
    response = httpx.request(method, f"{url}{path}")
    assert response.status_code == status
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and path in error["message"]


# --- defect 6: the OpenAPI document -------------------------------------------------------------


def test_openapi_documents_bodies_errors_and_metrics(service):
    url, backbone, _ = service
    document = httpx.get(f"{url}/openapi.json").json()
    schemas = document["components"]["schemas"]
    for path, model in (
        ("/v1/completions", "CompletionRequest"),
        ("/v1/chat/completions", "ChatCompletionRequest"),
    ):
        operation = document["paths"][path]["post"]
        ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert ref == f"#/components/schemas/{model}" and model in schemas
        assert {"400", "404", "413", "429", "500", "503"} <= set(operation["responses"])
        assert schemas[model]["properties"]["model"]["enum"] == [backbone.model_name]
        assert "text/event-stream" in operation["responses"]["200"]["content"]
    assert schemas["CompletionRequest"]["required"] == ["model", "prompt"]
    assert set(document["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
