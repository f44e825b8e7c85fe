"""The backbone service's engine room: split model + Lambda dispatch + continuous batching.

:class:`Backbone` wires the parts together from a package and a plan; the FastAPI app in
``backbone_service/`` is a thin layer of routes over it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from moeless.contracts.environment import (
    ALIAS,
    DEFAULT_DRAFT_CONFIDENCE,
    DEFAULT_MAX_BATCH,
    DEFAULT_REPLAN_INTERVAL_S,
)
from moeless.contracts.manifest import load_manifest
from moeless.contracts.plan import Plan, plan_for
from moeless.model.reference import eos_token_ids
from moeless.planning.concurrency import ForecastReplanner
from moeless.planning.planner import reprovision
from moeless.serving.coalesce import StepCoalescer
from moeless.serving.dispatch import LambdaDispatcher
from moeless.serving.generation import GenerationEngine, PrewarmHook
from moeless.serving.keep_warm import KeepWarm
from moeless.serving.replanner import CombinedLoads, Replanner, RollingLoads
from moeless.serving.stats import ServingStats

if TYPE_CHECKING:
    from moeless.prediction.trace import Trace
    from moeless.serving.prewarm import CrossLayerPrewarmer, SpsPrewarmer

DEFAULT_MAX_TOKENS_LIMIT = 1024


@dataclass
class BackboneConfig:
    """How to serve a package.

    Attributes:
        artifacts: output of ``moeless package``.
        plan: plan.json path; ``None``: one function per expert.
        lambda_endpoint: the local host's URL; ``None``: AWS (boto3's usual configuration).
        qualifier: alias the functions are invoked on.
        device: ``auto`` (CUDA when present), ``cpu`` or ``cuda``.
        model_name: the name clients pass as ``model`` (default: the artifacts folder's name).
        max_batch: sequences per engine step.
        prefill_chunk: prompt tokens per engine step (chunked prefill); ``None``: the chunk the
            plan was sized with (``params.deployment.prefill_chunk``), else each prompt whole.
        max_waiting: queued requests before 429.
        max_tokens_limit: largest ``max_tokens`` accepted.
        max_prompts: prompts one completion request may carry (one request must not fill the
            queue for everyone).
        max_body_bytes: largest request body read (413 beyond it).
        attempts: invokes tried per expert call before the in-process fallback.
        replan_interval_s: re-provision the functions from observed loads this often (0: never).
        predictor_trace: a trace of this model: Similar-Prompt Search learns from it and pre-warms
            each request's predicted functions (``None``: no pre-warming).
        predictor: which prompt-level predictor learns from ``predictor_trace``: ``kernel``
            (kernel-weighted neighbours, the best measured: docs/predictors.md) or ``sps`` (Remoe's).
        token_predictor: with ``predictor_trace``, the token-level pre-warmer fitted on it:
            ``crosslayer`` (each token's experts one layer ahead from those it chose: the best
            measured, docs/predictors.md) or ``none``.
        prewarm_idle_s: a function not invoked for this long is presumed cold.
        function_prefix: the deployed functions' name prefix (``moeless-STAGE-`` on AWS; see
            :meth:`moeless.contracts.plan.Plan.prefixed`); empty: the plan's names as they are.
        experts_source: the package in S3 (``s3://...``) that ``artifacts`` caches: an expert the
            fallback needs and the cache lacks is fetched from it.
        fallback_cache_bytes: most bytes of fallback experts kept (least recently used out
            first); ``None``: no bound.
        speculate: drafted tokens each decoding sequence carries into a forward (0: off);
            ``None``: the plan's (``params.deployment.speculate``), else 0.
        draft_model: a small causal LM with the served model's tokenizer that drafts them;
            ``None``: prompt lookup (n-grams of the text so far, no model).
        draft_confidence: the draft model's probability a drafted token needs (its draft stops
            before the first less sure one).
    """

    artifacts: Path
    plan: Path | None = None
    lambda_endpoint: str | None = None
    qualifier: str | None = ALIAS
    device: str = "auto"
    model_name: str | None = None
    max_batch: int = DEFAULT_MAX_BATCH
    prefill_chunk: int | None = None
    max_waiting: int = 256
    max_tokens_limit: int = DEFAULT_MAX_TOKENS_LIMIT
    max_prompts: int = 16
    max_body_bytes: int = 1024 * 1024
    attempts: int = 3
    replan_interval_s: float = DEFAULT_REPLAN_INTERVAL_S
    predictor_trace: Path | None = None
    predictor: str = "kernel"
    token_predictor: str = "crosslayer"
    prewarm_idle_s: float = 240.0
    function_prefix: str = ""
    experts_source: str | None = None
    fallback_cache_bytes: int | None = None
    speculate: int | None = None
    draft_model: Path | None = None
    draft_confidence: float = DEFAULT_DRAFT_CONFIDENCE


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


class Backbone:
    """The loaded service: tokenizer, split model, dispatcher, engine, stats."""

    def __init__(self, config: BackboneConfig, prewarm: PrewarmHook | None = None) -> None:
        from transformers import AutoTokenizer

        from moeless.lambda_host.client import lambda_client
        from moeless.model.split import load_split_model

        self.config = config
        artifacts = Path(config.artifacts)
        self.manifest = load_manifest(artifacts)
        self.plan: Plan = plan_for(self.manifest, config.plan).prefixed(config.function_prefix)
        self.model_name = config.model_name or artifacts.resolve().name
        self.stats = ServingStats()
        concurrency = 64
        client = lambda_client(config.lambda_endpoint, max_pool_connections=concurrency)
        self.dispatcher = LambdaDispatcher(
            artifacts,
            self.manifest,
            self.plan,
            client,
            qualifier=config.qualifier,
            attempts=config.attempts,
            max_concurrency=concurrency,
            stats=self.stats,
            fallback_source=config.experts_source,
            fallback_cache_bytes=config.fallback_cache_bytes,
            device=resolve_device(config.device),
        )
        keeper = KeepWarm(self.plan, self.dispatcher.warm)
        self.keep_warm = keeper.start() if keeper.needed else None
        self.coalescer = StepCoalescer(self.dispatcher)
        self.predicted_loads = RollingLoads(self.manifest.num_experts)
        self.prewarmer: PrewarmHook | None = prewarm
        self.token_prewarmer: CrossLayerPrewarmer | None = None
        if prewarm is None:
            self.prewarmer, self.token_prewarmer = self._prewarmers(config)
        self.coalescer.routing_observer = self.token_prewarmer.observe if self.token_prewarmer else None
        self.replanner: Replanner | None = None
        forecaster = ForecastReplanner.from_plan(self.plan)
        if forecaster is not None:  # a sized plan's own re-planner, at its own interval
            self.replanner = Replanner(
                self.plan,
                self.predicted_loads,
                reprovision,
                client,
                config.qualifier or ALIAS,
                float(self.plan.params["replan"]["interval_s"]),
                forecaster=forecaster,
                demand=self.dispatcher.take_demand,
                on_plan=self.keep_warm.follow if self.keep_warm is not None else None,
            ).start()
        elif config.replan_interval_s > 0:
            self.dispatcher.observed = RollingLoads(self.manifest.num_experts)
            self.replanner = Replanner(
                self.plan,
                CombinedLoads(self.dispatcher.observed, self.predicted_loads),
                reprovision,
                client,
                config.qualifier or ALIAS,
                config.replan_interval_s,
            ).start()
        self.device = resolve_device(config.device)
        self.model = load_split_model(artifacts, self.coalescer, self.manifest, device=self.device)
        self.tokenizer = AutoTokenizer.from_pretrained(artifacts / "backbone", local_files_only=True)
        self.max_context = int(getattr(self.model.config, "max_position_embeddings", 4096))
        self.vocab_size = int(getattr(self.model.config, "vocab_size", None) or len(self.tokenizer))
        self.engine = GenerationEngine(
            self.model,
            self.tokenizer,
            self.coalescer,
            eos_ids=eos_token_ids(self.model),
            max_batch=config.max_batch,
            max_waiting=config.max_waiting,
            stats=self.stats,
            prewarm=self.prewarmer,
            prefill_chunk=config.prefill_chunk or self.planned_prefill_chunk(),
            **self._speculation(config),
        )

    def _speculation(self, config: BackboneConfig) -> dict[str, Any]:
        """The engine's drafter and its ``speculate`` (none when it is 0)."""
        from moeless.serving.drafting import ModelDrafter, PromptLookupDrafter

        planned = (self.plan.params.get("deployment") or {}).get("speculate") or 0
        k = int(planned if config.speculate is None else config.speculate)
        if k == 0:
            return {}
        if config.draft_model is None:
            return {"drafter": PromptLookupDrafter(), "speculate": k}
        drafter = ModelDrafter(
            config.draft_model, self.device, self.tokenizer.get_vocab(), config.draft_confidence
        )
        return {"drafter": drafter, "speculate": k}

    def planned_prefill_chunk(self) -> int | None:
        """The prefill chunk the plan's concurrency was sized for (``None``: whole prompts)."""
        chunk = (self.plan.params.get("deployment") or {}).get("prefill_chunk")
        return int(chunk) if chunk else None

    def encode(self, prompt: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``prompt``; a chat-templated prompt already holds its special tokens."""
        return list(self.tokenizer(prompt, add_special_tokens=add_special_tokens)["input_ids"])

    def _prewarmers(self, config: BackboneConfig) -> tuple[PrewarmHook | None, CrossLayerPrewarmer | None]:
        """The prompt-level pre-warmer and the token-level one, both learnt from the one read of
        ``config.predictor_trace`` (none without a trace)."""
        from moeless.prediction.predictors import Embedder, fit_sps
        from moeless.prediction.prompt_predictors import fit_kernel
        from moeless.prediction.trace import TraceError, load_trace
        from moeless.serving.prewarm import SpsPrewarmer

        if config.token_predictor not in ("crosslayer", "none"):
            raise TraceError(f"unknown token predictor {config.token_predictor!r}; choose crosslayer or none")
        if config.predictor_trace is None:
            return None, None
        fitters: dict[str, Callable[..., Any]] = {"kernel": fit_kernel, "sps": fit_sps}
        if config.predictor not in fitters:
            raise TraceError(f"unknown predictor {config.predictor!r}; choose one of {', '.join(fitters)}")

        trace = load_trace(config.predictor_trace)
        if trace.layers != list(self.manifest.moe_layers) or trace.num_experts != self.manifest.num_experts:
            raise TraceError(
                f"{config.predictor_trace} was not recorded from this model's layers and experts"
            )
        predictor = fitters[config.predictor](trace, np.unique(trace.request), Embedder())
        scheduler = SpsPrewarmer(
            predictor,
            list(self.manifest.moe_layers),
            self.dispatcher.replicas,
            self.dispatcher.last_used,
            self.dispatcher.warm,
            self.manifest.top_k,
            self.dispatcher.warming,
            idle_s=config.prewarm_idle_s,
            predicted=self.predicted_loads,
        )
        return scheduler, self._token_prewarmer(config, trace, scheduler)

    def _token_prewarmer(
        self, config: BackboneConfig, trace: Trace, scheduler: SpsPrewarmer
    ) -> CrossLayerPrewarmer | None:
        """The cross-layer model fitted on the trace's tokens, pre-warming one layer ahead through
        ``scheduler``."""
        from moeless.prediction.crosslayer import CrossLayerModel
        from moeless.serving.prewarm import CrossLayerPrewarmer

        layers = list(self.manifest.moe_layers)
        if config.token_predictor == "none" or len(layers) < 2:
            return None
        experts = trace.experts.transpose(1, 0, 2).astype(np.int64)  # [T, L, k]
        weights = trace.weights.transpose(1, 0, 2).astype(np.float32)
        model = CrossLayerModel(trace.num_experts, self.manifest.top_k).fit(
            experts, weights, (1,), groups=trace.request
        )
        return CrossLayerPrewarmer(model, layers, scheduler.warm_if_cold)

    def close(self) -> None:
        if self.replanner is not None:
            self.replanner.stop()
        if self.keep_warm is not None:
            self.keep_warm.close()
        close_prewarmer = getattr(self.prewarmer, "close", None)
        if close_prewarmer is not None:
            close_prewarmer()
        self.engine.stop()
        self.dispatcher.close()
