"""Vendor API dialects: one adapter module per wire format (see `base.DialectAdapter`)."""

from __future__ import annotations

from services.gateway.dialects.anthropic import AnthropicMessages
from services.gateway.dialects.google import GoogleGenerateContent
from services.gateway.dialects.openai_chat import OpenAIChat
from services.gateway.dialects.openai_responses import OpenAIResponses

__all__ = ["AnthropicMessages", "GoogleGenerateContent", "OpenAIChat", "OpenAIResponses"]
