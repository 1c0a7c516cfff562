"""Trainer service: trajectory builders, GRPO loss, optimizer steps and weight publication."""
