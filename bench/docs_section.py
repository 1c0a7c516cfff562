"""Replace one `## ` section of the benchmark notebook (bench/results/notebook.md, or another run log under
bench/results/) with a benchmark's fresh results (used by `--write-docs`). docs/benchmarks.md, the user's page,
keeps one row per current figure and is updated by hand."""

from __future__ import annotations

from pathlib import Path

NOTEBOOK_MD = Path(__file__).resolve().parent / "results" / "notebook.md"
"""The dated sections behind docs/benchmarks.md's current figures."""
RAW_VLLM_LOG = Path(__file__).resolve().parent / "results" / "inference-vs-raw-vllm.md"
"""The dated runs of lodestar against raw vLLM (bench/inference.py --compare-raw, bench/frontend_layers.py)."""


def replace_section(heading: str, section: str, path: Path = NOTEBOOK_MD) -> None:
    """Put `section` (starting with the `heading` line) where that heading stands, or append it.

    The heading is matched as a whole line, so "## Inference" does not match "## Inference: vLLM". The old
    section runs up to the next `## ` heading.
    """
    doc = path.read_text() if path.exists() else "# Benchmarks\n"
    start = doc.find(heading + "\n")
    if start < 0:
        doc = doc.rstrip() + "\n\n" + section
    else:
        end = doc.find("\n## ", start + len(heading))
        doc = doc[:start] + section + (doc[end + 1 :] if end >= 0 else "")
    path.write_text(doc)
