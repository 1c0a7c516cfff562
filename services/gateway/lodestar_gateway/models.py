"""Bodies of the model-listing and token-counting endpoints (OpenAI/Anthropic list, Google list)."""

from __future__ import annotations

from typing import Any

from lodestar.v1 import inference_pb2


def openai_models(info: inference_pb2.GetModelInfoResponse, model: str | None = None) -> dict[str, Any]:
    """`GET /v1/models`: one list that reads as OpenAI's and as Anthropic's (the served model answers
    under any name, so a requested name is echoed)."""
    name = model or info.model_name
    entry = {
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": "lodestar",
        "type": "model",
        "display_name": name,
        "created_at": "1970-01-01T00:00:00Z",
    }
    return {"object": "list", "data": [entry], "has_more": False, "first_id": name, "last_id": name}


def google_models(info: inference_pb2.GetModelInfoResponse, model: str | None = None) -> dict[str, Any]:
    name = (model or info.model_name).removeprefix("models/")
    entry = {
        "name": f"models/{name}",
        "baseModelId": name,
        "version": str(info.policy_version.version),
        "displayName": name,
        "inputTokenLimit": info.context_length,
        "outputTokenLimit": info.max_new_tokens,
        "supportedGenerationMethods": ["generateContent", "streamGenerateContent", "countTokens"],
    }
    return {"models": [entry]}


def anthropic_count(tokens: int) -> dict[str, Any]:
    return {"input_tokens": tokens}


def google_count(tokens: int) -> dict[str, Any]:
    return {"totalTokens": tokens}
