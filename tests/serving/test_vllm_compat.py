"""The endpoint as a drop-in for vLLM's OpenAI-compatible server: what clients written against
vLLM send and read (default lengths, neutral values, logprobs, stream options, named errors, the
model card, /health, /version, /tokenize, /detokenize, the content type) and the OpenAPI bounds.

Each case failed before its fix; the OpenAPI ones run on a fake backbone (no model needed).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import httpx
import openai
import pytest

from backbone_service.app import create_app
from backbone_service.prepare import field_path
from moeless.serving.backbone import BackboneConfig
from moeless.serving.stats import ServingStats
from moeless.version import __version__
from tests.serving.test_serving import serving

LIMIT = 40  # the service's max_tokens limit: chat's default length stays short on the CPU
CHAT = [{"role": "user", "content": "Name a prime number."}]


@pytest.fixture(scope="module")
def checkpoint(tiny):
    return tiny.model("mixtral"), tiny.package("mixtral")


@pytest.fixture(scope="module")
def service(checkpoint):
    with serving(checkpoint[1], max_tokens_limit=LIMIT) as running:
        yield running


@pytest.fixture()
def client(service):
    return openai.OpenAI(base_url=f"{service[0]}/v1", api_key="unused", max_retries=0)


def post(url: str, path: str, body: object, content_type: str | None = "application/json") -> httpx.Response:
    headers = {"Content-Type": content_type} if content_type else {}
    return httpx.post(f"{url}{path}", content=json.dumps(body).encode(), headers=headers, timeout=60)


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


# --- 1. default lengths ----------------------------------------------------------------------------


def test_chat_without_max_tokens_runs_to_the_limit_and_completions_keep_16(service, client):
    _, backbone, _ = service
    chat = client.chat.completions.create(model=backbone.model_name, messages=CHAT, temperature=0)
    capped = client.chat.completions.create(
        model=backbone.model_name, messages=CHAT, temperature=0, max_completion_tokens=LIMIT
    )
    assert chat.usage.completion_tokens == capped.usage.completion_tokens > 16
    assert chat.choices[0].message.content == capped.choices[0].message.content
    plain = client.completions.create(model=backbone.model_name, prompt="Serverless", temperature=0)
    assert plain.usage.completion_tokens == 16 and plain.choices[0].finish_reason == "length"


def test_chat_without_max_tokens_stops_at_the_context(service, client):
    # GIVEN a chat whose prompt leaves a few tokens of the context (counted by /tokenize)
    url, backbone, _ = service

    def chat_of(words: int) -> list[dict]:
        return [{"role": "user", "content": "hello world " * words}]

    def count(words: int) -> int:
        return post(url, "/tokenize", {"messages": chat_of(words)}).json()["count"]

    per_word = count(101) - count(100)
    words = (backbone.max_context - count(0)) // per_word - 2
    while count(words + 1) < backbone.max_context:
        words += 1
    messages, room = chat_of(words), backbone.max_context - count(words)
    assert 1 <= room <= per_word
    # WHEN it asks for no length THEN it gets at most what the context leaves
    chat = client.chat.completions.create(model=backbone.model_name, messages=messages, temperature=0)
    assert chat.usage.prompt_tokens == backbone.max_context - room
    assert chat.usage.completion_tokens <= room
    assert chat.choices[0].finish_reason == ("length" if chat.usage.completion_tokens == room else "stop")
    # AND a prompt that fills the context is refused, not answered with nothing
    full = chat_of(words + 1)
    error = error_of(post(url, "/v1/chat/completions", {"model": backbone.model_name, "messages": full}), 400)
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"


# --- 2. neutral values are accepted, others refused with a reason ----------------------------------

NEUTRAL = [
    pytest.param("/v1/completions", {"best_of": 1}, id="best_of"),
    pytest.param("/v1/chat/completions", {"response_format": {"type": "text"}}, id="response_format"),
    pytest.param("/v1/chat/completions", {"tool_choice": "none"}, id="tool_choice"),
    pytest.param("/v1/chat/completions", {"parallel_tool_calls": False}, id="parallel_tool_calls"),
    pytest.param("/v1/chat/completions", {"store": False}, id="store"),
    pytest.param("/v1/chat/completions", {"tool_choice": None, "store": None}, id="nulls"),
]
REFUSED = [
    pytest.param("/v1/completions", {"best_of": 2}, "best_of", "one completion", id="best_of"),
    pytest.param("/v1/completions", {"best_of": True}, "best_of", "one completion", id="best_of-bool"),
    pytest.param(
        "/v1/chat/completions",
        {"response_format": {"type": "json_object"}},
        "response_format",
        "does not constrain",
        id="response_format",
    ),
    pytest.param(
        "/v1/chat/completions", {"tool_choice": "auto"}, "tool_choice", "no tools", id="tool_choice"
    ),
    pytest.param("/v1/chat/completions", {"store": True}, "store", "does not store", id="store"),
    pytest.param("/v1/completions", {"n": 2}, "n", "one completion", id="n"),
    pytest.param(
        "/v1/completions", {"presence_penalty": 0.5}, "presence_penalty", "not supported", id="penalty"
    ),
    pytest.param("/v1/completions", {"logprobs": 2}, "logprobs", "without alternatives", id="logprobs"),
    pytest.param(
        "/v1/chat/completions", {"top_logprobs": 3}, "top_logprobs", "without alt", id="top_logprobs"
    ),
]


def _body(backbone, path: str, fields: dict) -> dict:
    prompt = {"prompt": "A"} if path == "/v1/completions" else {"messages": CHAT}
    return {"model": backbone.model_name, "max_tokens": 2} | prompt | fields


@pytest.mark.parametrize("path, fields", NEUTRAL)
def test_neutral_values_are_accepted(service, path, fields):
    url, backbone, _ = service
    response = post(url, path, _body(backbone, path, fields))
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("path, fields, param, reason", REFUSED)
def test_values_the_server_cannot_honour_are_refused_with_the_field_and_why(
    service, path, fields, param, reason
):
    url, backbone, _ = service
    error = error_of(post(url, path, _body(backbone, path, fields)), 400)
    assert (
        error["param"] == param and error["message"].startswith(f"{param}: ") and reason in error["message"]
    )


# --- 3. logprobs ----------------------------------------------------------------------------------


def _reference_logprob(model_dir, ids: list[int], token: int) -> float:
    """``token``'s logprob after ``ids`` on the unsplit checkpoint (transformers, fp32)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0, -1]
    return float(torch.log_softmax(logits.double(), dim=-1)[token])


def test_completion_logprobs_0_gives_the_sampled_tokens(service, client, checkpoint):
    _, backbone, _ = service
    prompt = "The quick brown fox"
    answer = client.completions.create(
        model=backbone.model_name, prompt=prompt, max_tokens=8, temperature=0, logprobs=0
    )
    logprobs = answer.choices[0].logprobs
    assert logprobs is not None and len(logprobs.tokens) == answer.usage.completion_tokens
    assert "".join(logprobs.tokens) == answer.choices[0].text
    assert all(lp <= 0 for lp in logprobs.token_logprobs)
    assert logprobs.top_logprobs == [
        {t: lp} for t, lp in zip(logprobs.tokens, logprobs.token_logprobs, strict=True)
    ]
    assert logprobs.text_offset[0] == 0 and logprobs.text_offset[1] == len(logprobs.tokens[0])
    # the first one is the checkpoint's own logprob of that token
    first = backbone.encode(logprobs.tokens[0], add_special_tokens=False)[0]
    expected = _reference_logprob(checkpoint[0], backbone.encode(prompt), first)
    assert logprobs.token_logprobs[0] == pytest.approx(expected, abs=1e-4)
    # streamed, the chunks carry the same tokens
    chunks = list(
        client.completions.create(
            model=backbone.model_name, prompt=prompt, max_tokens=8, temperature=0, logprobs=0, stream=True
        )
    )
    streamed = [lp for c in chunks for lp in c.choices[0].logprobs.token_logprobs]
    assert streamed == pytest.approx(logprobs.token_logprobs)
    plain = client.completions.create(model=backbone.model_name, prompt=prompt, max_tokens=8, temperature=0)
    assert plain.choices[0].logprobs is None


def test_chat_logprobs_true_top_logprobs_0(service, client):
    _, backbone, _ = service
    chat = client.chat.completions.create(
        model=backbone.model_name, messages=CHAT, max_tokens=8, temperature=0, logprobs=True, top_logprobs=0
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    assert "".join(c.token for c in content) == chat.choices[0].message.content
    assert all(c.bytes == list(c.token.encode()) and c.top_logprobs == [] and c.logprob <= 0 for c in content)
    chunks = list(
        client.chat.completions.create(
            model=backbone.model_name, messages=CHAT, max_tokens=8, temperature=0, logprobs=True, stream=True
        )
    )
    streamed = [
        c.logprob for chunk in chunks if chunk.choices[0].logprobs for c in chunk.choices[0].logprobs.content
    ]
    assert streamed == pytest.approx([c.logprob for c in content])


# --- 4 and 5. stream options, and errors that name the field --------------------------------------


@pytest.mark.parametrize("stream", [False, None], ids=["stream-false", "no-stream"])
def test_stream_options_without_stream_is_refused(service, stream):
    url, backbone, _ = service
    body = {"model": backbone.model_name, "prompt": "A", "stream_options": {"include_usage": True}}
    if stream is not None:
        body["stream"] = stream
    error = error_of(post(url, "/v1/completions", body), 400)
    assert error["param"] == "stream_options"
    assert error["message"].endswith("Stream options can only be defined when `stream=True`.")


@pytest.mark.parametrize(
    "messages, param, reason",
    [
        pytest.param(
            [*CHAT, {"role": "tool", "content": "7", "tool_call_id": "call_1"}],
            "messages[1].role",
            "tool turns are not supported",
            id="tool-turn",
        ),
        pytest.param(
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is this?"},
                        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                    ],
                }
            ],
            "messages[0].content[1].type",
            "this model serves text only",
            id="image-part",
        ),
        pytest.param([{"role": "user"}], "messages[0].content", "Field required", id="missing-content"),
    ],
)
def test_chat_errors_name_the_field_and_the_reason(service, messages, param, reason):
    url, backbone, _ = service
    error = error_of(
        post(url, "/v1/chat/completions", {"model": backbone.model_name, "messages": messages}), 400
    )
    assert error["param"] == param and error["message"].startswith(f"{param}: {reason}"), error


@pytest.mark.parametrize(
    "data, loc, missing, path",
    [
        pytest.param({"a": [{"b": "x"}]}, ("a", 0, "b"), False, "a[0].b", id="plain"),
        pytest.param({"c": [1, [2]]}, ("c", "str"), False, "c", id="union-label-last"),
        pytest.param(
            {"c": [1, {"t": 2}]}, ("c", "list[P]", 1, "t"), False, "c[1].t", id="union-label-inside"
        ),
        pytest.param({"m": [{}]}, ("m", 0, "content"), True, "m[0].content", id="missing"),
        pytest.param({"Max-Tokens": 3}, ("Max-Tokens",), False, "Max-Tokens", id="extra-field"),
    ],
)
def test_field_path_keeps_only_what_is_in_the_body(data, loc, missing, path):
    assert field_path(data, loc, missing) == path


# --- 7 and 8. the model card, health, version, tokenizer -------------------------------------------


def test_model_card_has_max_model_len_and_root(service, client):
    url, backbone, _ = service
    listed = httpx.get(f"{url}/v1/models").json()["data"][0]
    card = httpx.get(f"{url}/v1/models/{backbone.model_name}").json()
    assert listed == card
    assert card["max_model_len"] == backbone.max_context == 512
    assert card["root"] == backbone.model_name and card["parent"] is None
    assert client.models.retrieve(backbone.model_name).max_model_len == 512


def test_health_and_version(service):
    url, _, _ = service
    health = httpx.get(f"{url}/health")
    assert health.status_code == 200 and health.content == b""
    assert httpx.get(f"{url}/version").json() == {"version": __version__}
    assert httpx.get(f"{url}/healthz").json()["status"] == "ok"  # the deployment's check, as it was


def test_tokenize_counts_as_the_generation_routes_do_and_detokenize_inverts_it(service, client):
    url, backbone, _ = service
    prompt = "Serverless experts"
    tokenized = post(url, "/tokenize", {"model": backbone.model_name, "prompt": prompt}).json()
    assert tokenized == {
        "count": len(tokenized["tokens"]),
        "max_model_len": 512,
        "tokens": backbone.encode(prompt),
    }
    completion = client.completions.create(model=backbone.model_name, prompt=prompt, max_tokens=1)
    assert completion.usage.prompt_tokens == tokenized["count"]
    chat = client.chat.completions.create(model=backbone.model_name, messages=CHAT, max_tokens=1)
    assert post(url, "/tokenize", {"messages": CHAT}).json()["count"] == chat.usage.prompt_tokens
    detokenized = post(
        url, "/detokenize", {"tokens": backbone.encode(prompt, add_special_tokens=False)}
    ).json()
    assert detokenized == {"prompt": prompt}


@pytest.mark.parametrize(
    "path, body, status, param",
    [
        pytest.param(
            "/tokenize", {"model": "nope", "prompt": "x"}, 404, "model", id="tokenize-unknown-model"
        ),
        pytest.param("/tokenize", {"prompt": 3}, 400, "prompt", id="tokenize-bad-prompt"),
        pytest.param(
            "/tokenize",
            {"messages": [{"role": "tool", "content": "x"}]},
            400,
            "messages[0].role",
            id="tokenize-tool",
        ),
        pytest.param("/detokenize", {"tokens": [10**6]}, 400, "tokens", id="detokenize-outside-vocabulary"),
    ],
)
def test_tokenizer_routes_refuse_in_openai_shape(service, path, body, status, param):
    url, _, _ = service
    assert error_of(post(url, path, body), status)["param"] == param


def test_an_integral_float_is_the_integer_the_document_says_it_is(service):
    # JSON Schema (and so /openapi.json) takes 2.0 as an integer; a fraction is still refused
    url, backbone, _ = service
    ids = [float(i) for i in backbone.encode("Serverless", add_special_tokens=False)]
    body = {"model": backbone.model_name, "prompt": ids, "max_tokens": 2.0, "seed": 3.0}
    assert post(url, "/v1/completions", body).status_code == 200
    assert post(url, "/detokenize", {"tokens": ids}).json() == {"prompt": "Serverless"}
    assert error_of(post(url, "/detokenize", {"tokens": [1.5]}), 400)["param"] == "tokens[0]"


# --- 9. the content type ---------------------------------------------------------------------------


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/tokenize"])
def test_a_body_that_is_not_json_is_415(service, path, content_type):
    url, backbone, _ = service
    body = _body(backbone, "/v1/completions", {})  # the body is never read: its type is refused first
    error = error_of(post(url, path, body, content_type), 415)
    assert "application/json" in error["message"] and error["code"] == "unsupported_media_type"


def test_json_with_a_charset_is_json(service):
    url, backbone, _ = service
    response = post(
        url, "/v1/completions", _body(backbone, "/v1/completions", {}), "application/json; charset=utf-8"
    )
    assert response.status_code == 200, response.text


# --- 6. the OpenAPI document, on a fake backbone --------------------------------------------------


def _document(max_context: int, max_tokens_limit: int) -> dict:
    fake = SimpleNamespace(
        model_name="tiny",
        config=BackboneConfig(artifacts="unused", max_tokens_limit=max_tokens_limit),
        max_context=max_context,
        vocab_size=512,
        stats=ServingStats(),
    )
    return create_app(fake).openapi()  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "max_context, max_tokens_limit, maximum",
    [
        pytest.param(512, 1024, 511, id="the-context-bounds"),  # at least one prompt token
        pytest.param(4096, 256, 256, id="the-limit-bounds"),
    ],
)
def test_openapi_bounds_max_tokens_by_the_context_and_the_limit(max_context, max_tokens_limit, maximum):
    schemas = _document(max_context, max_tokens_limit)["components"]["schemas"]
    for model, field in [
        ("CompletionRequest", "max_tokens"),
        ("ChatCompletionRequest", "max_tokens"),
        ("ChatCompletionRequest", "max_completion_tokens"),
    ]:
        integer = schemas[model]["properties"][field]["anyOf"][0]
        assert integer == {"type": "integer", "minimum": 1, "maximum": maximum}, (model, field)


def test_openapi_documents_the_vllm_routes_and_the_stream_options_rule():
    document = _document(512, 1024)
    paths, schemas = document["paths"], document["components"]["schemas"]
    assert set(paths) >= {"/health", "/version", "/tokenize", "/detokenize", "/healthz"}
    tokenize_body = paths["/tokenize"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert tokenize_body == {
        "anyOf": [
            {"$ref": "#/components/schemas/TokenizePromptRequest"},
            {"$ref": "#/components/schemas/TokenizeChatRequest"},
        ]
    }
    assert schemas["TokenizePromptRequest"]["properties"]["model"]["enum"] == ["tiny", None]
    assert schemas["DetokenizeRequest"]["properties"]["tokens"]["items"]["maximum"] == 511
    assert "415" in paths["/v1/completions"]["post"]["responses"]
    assert {"max_model_len", "root"} <= set(schemas["ModelCard"]["properties"])
    for model in ("CompletionRequest", "ChatCompletionRequest"):
        assert schemas[model]["then"] == {"required": ["stream"], "properties": {"stream": {"const": True}}}
