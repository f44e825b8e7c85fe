"""The request body of ``POST /v1/completions`` (OpenAI's shape) and its validation."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


class CompletionRequest(BaseModel):
    """OpenAI ``/v1/completions`` fields. Unknown fields are refused, and fields OpenAI has but
    this server does not implement are accepted only at their neutral value."""

    model_config = ConfigDict(extra="forbid", strict=False)

    model: str
    prompt: str | list[str]
    max_tokens: int = Field(16, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    stream: bool = False
    seed: int | None = None
    n: int = Field(1, ge=1, le=1, description="one completion per prompt")
    echo: bool = Field(False, description="not supported: must be false")
    logprobs: int | None = Field(None, le=0, description="not supported")
    presence_penalty: float = Field(0.0, ge=0.0, le=0.0, description="not supported: must be 0")
    frequency_penalty: float = Field(0.0, ge=0.0, le=0.0, description="not supported: must be 0")
    user: str | None = None
    stream_options: dict[str, Any] | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt_not_empty(cls, value: str | list[str]) -> str | list[str]:
        prompts = [value] if isinstance(value, str) else value
        if not prompts or any(not p for p in prompts):
            raise ValueError("prompt must be a non-empty string or a non-empty list of non-empty strings")
        return value

    @field_validator("stop")
    @classmethod
    def _at_most_four_stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and (len(value) > 4 or any(not s for s in value)):
            raise ValueError("stop takes at most 4 non-empty strings")
        return value

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: bool) -> bool:
        if value:
            raise ValueError("echo is not supported")
        return value

    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
