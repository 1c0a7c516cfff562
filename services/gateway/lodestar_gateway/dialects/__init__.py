"""Vendor API dialects: one adapter module per wire format (see `base.DialectAdapter`)."""

from __future__ import annotations

from lodestar_gateway.dialects.anthropic import AnthropicMessages
from lodestar_gateway.dialects.google import GoogleGenerateContent
from lodestar_gateway.dialects.openai_chat import OpenAIChat
from lodestar_gateway.dialects.openai_responses import OpenAIResponses

__all__ = ["AnthropicMessages", "GoogleGenerateContent", "OpenAIChat", "OpenAIResponses"]
