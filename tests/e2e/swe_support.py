"""Shared by the swe-mini e2e tests (test_swe_runs, test_swe_training, test_swe_docker)."""

from __future__ import annotations

FIX_SLUGIFY = (  # the shell command that fixes swe-mini's slugify bug (the scripted agent's tool call)
    "if [ -d slugify ]; then sed -i -e 's/\\[^a-z0-9\\]\"/[^a-z0-9]+\"/' "
    "-e 's/text.lower())$/text.lower()).strip(\"-\")/' slugify/__init__.py; fi; git status --short"
)
