"""vLLM's ``POST /tokenize`` and ``POST /detokenize``: the served tokenizer, as the generation
routes use it, so that a client can count a prompt's tokens against ``max_model_len`` first.

A prompt is tokenised as ``/v1/completions`` tokenises it, ``messages`` as ``/v1/chat/completions``
renders and tokenises them: ``count`` is the ``prompt_tokens`` those routes would report.
"""

from __future__ import annotations

from typing import Any

from backbone_service.prepare import chat_prompt, check_model, check_vocabulary, read_json, validate
from backbone_service.schemas import DetokenizeRequest, TokenizeChatRequest, TokenizePromptRequest
from moeless.serving.backbone import Backbone


def tokenize(backbone: Backbone, raw: bytes) -> dict[str, Any]:
    """``{"count", "max_model_len", "tokens"}`` of a ``prompt`` or of ``messages``."""
    data = read_json(raw)
    body = validate(data, TokenizeChatRequest if "messages" in data else TokenizePromptRequest)
    check_model(backbone, body.model)
    text = chat_prompt(backbone, body.messages) if isinstance(body, TokenizeChatRequest) else body.prompt
    tokens = backbone.encode(text, add_special_tokens=body.add_special_tokens)
    return {"count": len(tokens), "max_model_len": backbone.max_context, "tokens": tokens}


def detokenize(backbone: Backbone, raw: bytes) -> dict[str, Any]:
    """``{"prompt"}``: the text of ``tokens`` (special tokens kept, as vLLM's)."""
    body: DetokenizeRequest = validate(read_json(raw), DetokenizeRequest)
    check_model(backbone, body.model)
    check_vocabulary(backbone, body.tokens, "tokens")
    return {"prompt": backbone.tokenizer.decode(body.tokens)}
