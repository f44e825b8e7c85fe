"""Chat messages to one prompt string: the tokenizer's own chat template, or a plain fallback.

Checkpoints that ship a chat template (``tokenizer.chat_template``) are rendered with it, as
``transformers`` would. Tokenizers without one (the tiny models are given this one too, so they
render the same) use :data:`DEFAULT_CHAT_TEMPLATE`: each message as ``<|ROLE|>`` on its own line,
then its content on the next, and ``<|assistant|>`` plus a newline to prompt the reply.
"""

from __future__ import annotations

from typing import Any

DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def render_chat(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """The prompt of ``messages`` (``[{"role", "content"}]``), ending where the assistant replies."""
    return tokenizer.apply_chat_template(
        messages,
        tokenize=False,
        add_generation_prompt=True,
        chat_template=None if tokenizer.chat_template else DEFAULT_CHAT_TEMPLATE,
    )
