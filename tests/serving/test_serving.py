"""The backbone service end to end: REST (official openai client), experts on the local Lambda host,
tokens compared with ``generate`` on the unsplit checkpoint."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import httpx
import openai
import pytest

from backbone_service.app import create_app
from backbone_service.server import BackgroundServer
from moeless.contracts.manifest import load_manifest
from moeless.contracts.plan import load_plan, one_function_per_expert
from moeless.lambda_host import LambdaHost
from moeless.lambda_host.experts import expert_function_configs
from moeless.serving.backbone import Backbone, BackboneConfig
from moeless.serving.generation import SamplingParams
from tests.lambda_helpers import wait_for

REPO = Path(__file__).resolve().parents[2]
EXPERT_ROOT = REPO / "functions" / "expert"
FAULTY_ROOT = Path(__file__).resolve().parents[1] / "lambda_handlers"
PROMPTS = [
    "The quick brown fox",
    "def fibonacci(n):",
    "Lambda functions scale",
    "A",
    "In the beginning the Universe was created. This has made a lot of people very angry",
    "import numpy as np\nx =",
    "Mixture of experts",
    "Serverless",
]


def reference_ids(model_dir: Path, prompts: list[str], max_new_tokens: int) -> list[list[int]]:
    """Greedy ``generate`` on the original checkpoint (fp32), without the prompt and the final EOS."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    eos = model.generation_config.eos_token_id
    results = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
        new = out[0, ids.shape[1] :].tolist()
        results.append(new[:-1] if new and new[-1] == eos else new)
    return results


def engine_ids(backbone: Backbone, prompts: list[str], max_new_tokens: int) -> list[list[int]]:
    """Greedy ids through the service's engine, all prompts submitted together (one batch)."""
    sequences = [
        backbone.engine.submit(
            backbone.encode(p), SamplingParams(max_new_tokens, temperature=0.0), lambda e: None
        )
        for p in prompts
    ]
    for sequence in sequences:
        assert sequence.done.wait(120), "generation did not finish"
        assert sequence.error is None, sequence.error
    return [s.generated for s in sequences]


@contextmanager
def serving(artifacts: Path, configs=None, plan_path: Path | None = None, **backbone_options):
    manifest = load_manifest(artifacts)
    plan = load_plan(plan_path, manifest) if plan_path else one_function_per_expert(manifest)
    configs = configs or expert_function_configs(artifacts, plan, EXPERT_ROOT)
    with LambdaHost(configs) as host:
        backbone = Backbone(
            BackboneConfig(artifacts, plan=plan_path, lambda_endpoint=host.endpoint_url, **backbone_options)
        )
        try:
            with BackgroundServer(create_app(backbone)) as server:
                yield server.url, backbone, host
        finally:
            backbone.close()


@pytest.fixture(scope="module")
def mixtral(tiny):
    return tiny.model("mixtral"), tiny.package("mixtral")


@pytest.fixture(scope="module")
def service(mixtral):
    with serving(mixtral[1], max_tokens_limit=256) as running:
        yield running


def test_openai_client_greedy_completion_equals_generate(service, mixtral):
    url, backbone, _ = service
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    expected = reference_ids(mixtral[0], PROMPTS[:1], 12)[0]
    answer = client.completions.create(
        model=backbone.model_name, prompt=PROMPTS[0], max_tokens=12, temperature=0
    )
    assert answer.choices[0].text == backbone.tokenizer.decode(expected, skip_special_tokens=True)
    assert answer.usage.completion_tokens == len(expected)
    assert answer.usage.prompt_tokens == len(backbone.encode(PROMPTS[0]))
    assert answer.choices[0].finish_reason == ("length" if len(expected) == 12 else "stop")


def test_eight_concurrent_requests_of_different_lengths_equal_generate(service, mixtral):
    url, backbone, _ = service
    expected = reference_ids(mixtral[0], PROMPTS, 10)
    assert engine_ids(backbone, PROMPTS, 10) == expected
    before = backbone.stats.get("invokes")
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")

    def ask(prompt: str) -> str:
        return client.completions.create(
            model=backbone.model_name, prompt=prompt, max_tokens=10, temperature=0
        )

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, PROMPTS))
    texts = [a.choices[0].text for a in answers]
    assert texts == [backbone.tokenizer.decode(ids, skip_special_tokens=True) for ids in expected]
    # continuous batching: the 8 requests shared invokes (far fewer than 8 separate runs would need)
    assert backbone.stats.get("invokes") - before < 8 * 10 * 2 * 2


def test_streaming_gives_the_same_text_in_chunks(service):
    url, backbone, _ = service
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    whole = client.completions.create(
        model=backbone.model_name, prompt=PROMPTS[1], max_tokens=16, temperature=0
    )
    chunks = list(
        client.completions.create(
            model=backbone.model_name, prompt=PROMPTS[1], max_tokens=16, temperature=0, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_stop_string_truncates(service):
    url, backbone, _ = service
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    whole = client.completions.create(
        model=backbone.model_name, prompt=PROMPTS[2], max_tokens=16, temperature=0
    )
    text = whole.choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    cut = client.completions.create(
        model=backbone.model_name, prompt=PROMPTS[2], max_tokens=16, temperature=0, stop=[stop]
    )
    assert cut.choices[0].text == text[: text.find(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_sampling_with_a_seed_is_reproducible(service):
    url, backbone, _ = service
    body = {
        "model": backbone.model_name,
        "prompt": PROMPTS[3],
        "max_tokens": 8,
        "temperature": 1.0,
        "top_p": 0.9,
        "seed": 7,
    }
    first = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
    second = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
    assert first["choices"][0]["text"] == second["choices"][0]["text"]


@pytest.mark.parametrize(
    "content, status, needle",
    [
        (b"{not json", 400, "not valid JSON"),
        (b"\xff\xfe{}", 400, "not UTF-8"),
        (b"[1, 2]", 400, "JSON object"),
        ({"prompt": "hi", "max_tokens": 4}, 400, "model"),
        ({"model": "MODEL", "prompt": 42}, 400, "prompt"),
        ({"model": "MODEL", "prompt": ""}, 400, "prompt"),
        ({"model": "MODEL", "prompt": "hi", "max_tokens": -1}, 400, "max_tokens"),
        ({"model": "MODEL", "prompt": "hi", "max_tokens": 100000}, 400, "limit"),
        ({"model": "MODEL", "prompt": "hi", "temperature": 5}, 400, "temperature"),
        ({"model": "MODEL", "prompt": "hi", "surprise": True}, 400, "surprise"),
        ({"model": "MODEL", "prompt": "hi", "n": 2}, 400, "n"),
        ({"model": "MODEL", "prompt": "hi", "echo": True}, 400, "echo"),
        ({"model": "MODEL", "prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
        ({"model": "MODEL", "prompt": "word " * 5000, "max_tokens": 16}, 400, "context"),
        ({"model": "no-such-model", "prompt": "hi"}, 404, "not served"),
    ],
)
def test_bad_requests_get_a_4xx_with_a_reason(service, content, status, needle):
    url, backbone, _ = service
    if isinstance(content, dict):
        content = json.dumps(content).replace('"MODEL"', json.dumps(backbone.model_name)).encode()
    response = httpx.post(
        f"{url}/v1/completions", content=content, timeout=60, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == status
    error = response.json()["error"]
    assert needle in error["message"] and error["type"] == "invalid_request_error"


def test_health_models_and_metrics(service):
    url, backbone, _ = service
    assert httpx.get(f"{url}/healthz").json()["status"] == "ok"
    assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == backbone.model_name
    httpx.post(
        f"{url}/v1/completions",
        json={"model": backbone.model_name, "prompt": "x", "max_tokens": 2},
        timeout=60,
    )
    metrics = httpx.get(f"{url}/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    text = metrics.text
    for name in (
        "moeless_requests_total",
        "moeless_tokens_total",
        "moeless_expert_invokes_total",
        "moeless_expert_retries_total",
        "moeless_expert_fallbacks_total",
        "moeless_expert_cold_starts_total",
        'moeless_layer_dispatch_seconds_bucket{layer="0"',
    ):
        assert name in text, name


def test_overload_answers_429_with_retry_after(mixtral):
    artifacts = mixtral[1]
    configs = expert_function_configs(
        artifacts, one_function_per_expert(load_manifest(artifacts)), EXPERT_ROOT
    )
    slow = [_faulty(c, "slow") for c in configs]  # every step takes >= 0.6 s: the queue stays full
    with serving(artifacts, slow, max_batch=1, max_waiting=1) as (url, backbone, _):
        body = {"model": backbone.model_name, "prompt": PROMPTS[4], "max_tokens": 4, "temperature": 0}
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(httpx.post, f"{url}/v1/completions", json=body, timeout=120)
            wait_for(lambda: backbone.engine.load() == (1, 0))
            second = pool.submit(httpx.post, f"{url}/v1/completions", json=body, timeout=120)
            wait_for(lambda: backbone.engine.load() == (1, 1))
            third = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
            assert third.status_code == 429 and third.headers["Retry-After"] == "1"
            assert "busy" in third.json()["error"]["message"]
            assert first.result().status_code == 200 and second.result().status_code == 200


# --- faults ----------------------------------------------------------------------------------------


def _faulty(config, fault: str):
    return replace(
        config,
        task_root=FAULTY_ROOT,
        handler="faulty_expert.handler",
        environment=config.environment | {"FAULT": fault},
    )


def test_failing_functions_are_retried_then_served_in_process_with_identical_tokens(mixtral):
    model_dir, artifacts = mixtral
    configs = expert_function_configs(
        artifacts, one_function_per_expert(load_manifest(artifacts)), EXPERT_ROOT
    )
    by_name = {c.name: c for c in configs}
    by_name["moeless-l000-e000"] = _faulty(by_name["moeless-l000-e000"], "raise")
    by_name["moeless-l000-e001"] = _faulty(by_name["moeless-l000-e001"], "exit")
    by_name["moeless-l001-e002"] = _faulty(by_name["moeless-l001-e002"], "garbage")
    by_name["moeless-l001-e003"].reserved_concurrency = 0  # every call throttled
    by_name["moeless-l001-e004"] = replace(_faulty(by_name["moeless-l001-e004"], "slow"), timeout_s=0.05)
    expected = reference_ids(model_dir, PROMPTS, 8)
    with serving(artifacts, list(by_name.values())) as (_, backbone, host):
        assert engine_ids(backbone, PROMPTS, 8) == expected
        stats = backbone.stats
        assert stats.get("fallbacks") > 0 and stats.get("retries") > 0 and stats.get("throttles") > 0
        assert stats.get("requests_failed") == 0
        bill = host.meter.snapshot()["functions"]
        assert bill["moeless-l000-e000"]["errors"] > 0 and bill["moeless-l001-e003"]["throttles"] > 0
        assert bill["moeless-l001-e004"]["errors"] > 0  # timed out


def test_a_failing_replica_is_retried_on_a_healthy_one(mixtral, tmp_path):
    model_dir, artifacts = mixtral
    manifest = load_manifest(artifacts)
    plan = one_function_per_expert(manifest)
    for spec in list(plan.functions):  # a second replica of every layer-0 expert
        if spec.experts[0][0] == 0:
            plan.functions.append(replace(spec, name=f"{spec.name}-b"))
    plan.save(tmp_path / "plan.json")
    configs = expert_function_configs(artifacts, plan, EXPERT_ROOT)
    configs = [_faulty(c, "raise") if c.name.endswith("-b") else c for c in configs]
    expected = reference_ids(model_dir, PROMPTS[:4], 8)
    with serving(artifacts, configs, plan_path=tmp_path / "plan.json") as (_, backbone, host):
        assert engine_ids(backbone, PROMPTS[:4], 8) == expected
        assert backbone.stats.get("retries") > 0 and backbone.stats.get("fallbacks") == 0
        bill = host.meter.snapshot()["functions"]
        assert any(bill[c.name]["errors"] for c in configs if c.name.endswith("-b"))


def test_experts_placed_on_the_backbone_are_never_invoked(mixtral, tmp_path):
    model_dir, artifacts = mixtral
    plan = one_function_per_expert(load_manifest(artifacts))
    on_backbone = {(0, 0), (0, 1), (1, 5)}
    for placement in plan.experts:
        if (placement.layer, placement.expert) in on_backbone:
            placement.placement, placement.function = "host", None
    plan.functions = [f for f in plan.functions if tuple(f.experts[0]) not in on_backbone]
    plan.save(tmp_path / "plan.json")
    expected = reference_ids(model_dir, PROMPTS[:4], 8)
    with serving(artifacts, plan_path=tmp_path / "plan.json") as (_, backbone, host):
        assert engine_ids(backbone, PROMPTS[:4], 8) == expected
        assert backbone.stats.get("fallbacks") == 0
        assert "moeless-l000-e000" not in host.pools
        assert host.meter.snapshot()["totals"]["requests"] == backbone.stats.get("invokes")


def test_a_three_tier_plan_gives_the_same_tokens_as_the_unsplit_model(mixtral, tmp_path):
    """gpu, host and function experts in one plan, and host experts that offload a prefill's rows
    to their functions: the tokens are the unsplit model's (on this CPU machine the gpu tier runs
    on the CPU too), and only the function tier and the offloaded prefills are invoked."""
    model_dir, artifacts = mixtral
    plan = one_function_per_expert(load_manifest(artifacts))
    tiers = {(0, 0): "gpu", (1, 3): "gpu", (0, 1): "host", (1, 6): "host"}
    # host experts that also have their functions, for layers of 8 rows or more: the prompts'
    # prefills, not the batch of 4 sequences decoding
    offloading = {(0, 4), (1, 1)}
    for placement in plan.experts:
        key = (placement.layer, placement.expert)
        if key in tiers:
            placement.placement, placement.function = tiers[key], None
        elif key in offloading:
            placement.placement, placement.offload_rows = "host", 8
    plan.functions = [f for f in plan.functions if tuple(f.experts[0]) not in tiers]
    plan.save(tmp_path / "plan.json")
    loaded = load_plan(tmp_path / "plan.json", load_manifest(artifacts))
    assert set(loaded.in_process()) == set(tiers) | offloading
    expected = reference_ids(model_dir, PROMPTS[:4], 8)
    with serving(artifacts, plan_path=tmp_path / "plan.json") as (_, backbone, host):
        assert engine_ids(backbone, PROMPTS[:4], 8) == expected
        assert backbone.stats.get("fallbacks") == 0
        assert not {"moeless-l000-e000", "moeless-l001-e003", "moeless-l000-e001"} & set(host.pools)
        assert backbone.stats.get("offloads") > 0  # the prompts' prefills reached the functions
        assert host.meter.snapshot()["totals"]["requests"] == backbone.stats.get("invokes")


def test_a_plan_packing_each_layers_experts_in_one_function_gives_the_same_tokens(mixtral, tmp_path):
    import numpy as np

    from moeless.planning.packing import pack_within_layer

    model_dir, artifacts = mixtral
    manifest = load_manifest(artifacts)
    n = manifest.num_experts
    plan = pack_within_layer(
        one_function_per_expert(manifest), n, lambda _: np.ones((n, n)), lambda _: np.ones(n), lambda _: 1769
    )
    plan.save(tmp_path / "plan.json")
    expected = reference_ids(model_dir, PROMPTS[:4], 8)
    with serving(artifacts, plan_path=tmp_path / "plan.json") as (_, backbone, host):
        assert engine_ids(backbone, PROMPTS[:4], 8) == expected
        assert backbone.stats.get("fallbacks") == 0 and backbone.stats.get("invoke_errors") == 0
        assert sorted(host.pools) == sorted(f.name for f in plan.functions)
        steps = backbone.stats.get("invokes") / len(manifest.moe_layers)  # one invoke per layer and step
        assert steps == int(steps) and steps <= 4 * 8
        assert host.meter.snapshot()["totals"]["requests"] == backbone.stats.get("invokes")


def test_the_service_prefills_in_the_chunks_its_plan_was_sized_with(mixtral, tmp_path):
    from dataclasses import replace

    model_dir, artifacts = mixtral
    manifest = load_manifest(artifacts)
    plan = one_function_per_expert(manifest)
    replace(plan, params={"deployment": {"prefill_chunk": 3}}).save(tmp_path / "plan.json")
    expected = reference_ids(model_dir, PROMPTS[:4], 6)
    with serving(artifacts, plan_path=tmp_path / "plan.json") as (_, backbone, _host):
        assert backbone.engine.prefill_chunk == 3
        assert engine_ids(backbone, PROMPTS[:4], 6) == expected


def test_pre_warming_from_a_trace_runs_at_the_prompt_and_the_token_level_and_keeps_the_tokens(
    mixtral, tmp_path
):
    from moeless.prediction.trace import profile

    model_dir, artifacts = mixtral
    profile(model_dir, PROMPTS, tmp_path / "trace", max_new_tokens=6, progress=False)
    expected = reference_ids(model_dir, PROMPTS[:4], 8)
    options = {"predictor_trace": tmp_path / "trace", "predictor": "sps", "prewarm_idle_s": 0.0}
    with serving(artifacts, **options) as (_, backbone, _):
        assert engine_ids(backbone, PROMPTS[:4], 8) == expected
        assert backbone.token_prewarmer is not None and backbone.token_prewarmer.predictions > 0
        assert backbone.stats.get("prewarm_invokes") > 0 and backbone.stats.get("fallbacks") == 0
    with serving(artifacts, **options, token_predictor="none") as (_, backbone, _):
        assert backbone.token_prewarmer is None and backbone.coalescer.routing_observer is None


def test_backbone_dockerfile_copies_only_what_exists():
    dockerfile = (REPO / "backbone_service" / "Dockerfile").read_text()
    sources = [line.split()[1] for line in dockerfile.splitlines() if line.startswith("COPY ")]
    assert sources
    for source in sources:
        assert (REPO / source).exists(), f"the Dockerfile copies {source}, which does not exist"


def test_the_service_speculates_as_its_plan_or_its_options_say_and_reports_it(mixtral, tmp_path):
    """A plan sized with speculation serves with it (prompt lookup without a draft model), the
    option overrides it, a draft model drafts; tokens stay generate's; /metrics reports it."""
    from dataclasses import replace

    model_dir, artifacts = mixtral
    plan = one_function_per_expert(load_manifest(artifacts))
    replace(plan, params={"deployment": {"speculate": 3}}).save(tmp_path / "plan.json")
    prompts = [p * 3 for p in PROMPTS[:4]]  # repeated text: prompt lookup finds drafts
    expected = reference_ids(model_dir, prompts, 8)
    with serving(artifacts, plan_path=tmp_path / "plan.json") as (url, backbone, _host):
        assert backbone.engine.speculate == 3 and backbone.engine.drafter.name == "prompt-lookup"
        assert engine_ids(backbone, prompts, 8) == expected
        metrics = httpx.get(f"{url}/metrics").text
        assert 'moeless_draft_tokens_total{outcome="proposed"}' in metrics
        assert "moeless_decode_tokens_total" in metrics
    with serving(artifacts, plan_path=tmp_path / "plan.json", speculate=0) as (_, backbone, _host):
        assert backbone.engine.drafter is None
    with serving(artifacts, speculate=2, draft_model=model_dir) as (_, backbone, _host):
        assert backbone.engine.drafter.name == "draft-model"
        assert engine_ids(backbone, prompts, 8) == expected
        counters = backbone.stats.snapshot()["counters"]
        assert counters["decode_tokens"] > counters["decode_verifications"]
