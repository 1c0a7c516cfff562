"""Forward pass: tree attention equals dense masked attention, chunked log-softmax equals the full one,
target logprobs equal the stock model's per call, and the layout check."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from lodestar_trainer.builders import BuilderKind, build_sequences
from lodestar_trainer.data.pack import pack
from lodestar_trainer.data.synthetic import SMALL_SHAPE, synthetic_samples
from lodestar_trainer.step.attention import TreeLayout, tree_attention
from lodestar_trainer.step.forward import chunked_target_logprobs, target_logprobs
from tests.trainer.attention_support import dense_mask, random_forest
from tests.trainer.helpers import target_path


@pytest.mark.parametrize("block", [4, 16, 1000])
def test_tree_attention_equals_dense_masked_attention(block: int) -> None:
    parents = random_forest(150, seed=block)
    torch.manual_seed(0)
    q = torch.randn(1, 4, 150, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 150, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 150, 8, dtype=torch.float64, requires_grad=True)
    out = tree_attention(q, k, v, TreeLayout.of(parents, block=block), 0.3)
    grad_out = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=dense_mask(parents), scale=0.3, enable_gqa=True)
    expected_grads = torch.autograd.grad(expected, (q, k, v), grad_out)
    torch.testing.assert_close(out, expected)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want)


def test_layout_rejects_a_forest_that_is_not_pre_order() -> None:
    TreeLayout.of([-1, 0, 1, 0, 3, -1, 5])
    with pytest.raises(ValueError, match="token 4: parent 1"):
        TreeLayout.of([-1, 0, 1, 0, 1])  # token 4 hangs under 1, whose subtree ended at token 3


def test_layout_skips_key_blocks_without_ancestors() -> None:
    # three packed linear sequences of 8: query block 2 (tokens 16-23) sees only its own block
    layout = TreeLayout.of([-1, *range(7), -1, *range(8, 15), -1, *range(16, 23)], block=8)
    assert layout.keys[2] == slice(16, 24)
    tree = TreeLayout.of([-1, *range(7), 7, *range(8, 15), 7, *range(16, 23)], block=8)
    assert torch.equal(tree.keys[2], torch.cat([torch.arange(8), torch.arange(16, 24)]))  # trunk + own branch


@pytest.mark.parametrize(("rows", "vocab"), [(37, 1000), (5, 17)])
def test_chunked_log_softmax_equals_the_full_one(rows: int, vocab: int) -> None:
    torch.manual_seed(1)
    hidden = torch.randn(rows, 12, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(vocab, 12, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(vocab, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, vocab, (rows,))
    got = chunked_target_logprobs(hidden, weight, targets, bias=bias, vocab_chunk=7, row_chunk=8)
    full = torch.log_softmax(hidden @ weight.T + bias, -1)[torch.arange(rows), targets]
    torch.testing.assert_close(got, full.float())
    grad = torch.randn(rows, dtype=torch.float64)
    got_grads = torch.autograd.grad(got, (hidden, weight, bias), grad.float())
    full_grads = torch.autograd.grad(full, (hidden, weight, bias), grad)
    for chunked, dense in zip(got_grads, full_grads, strict=True):
        torch.testing.assert_close(chunked, dense, atol=1e-5, rtol=1e-4)  # fp32 inside


def test_chunked_log_softmax_never_computes_more_than_a_chunk_of_logits(monkeypatch: pytest.MonkeyPatch) -> None:
    from lodestar_trainer.step import forward

    shapes: list[tuple[int, ...]] = []
    real = forward._chunk_logits

    def spy(hidden: torch.Tensor, *args: Any) -> torch.Tensor:
        logits = real(hidden, *args)
        shapes.append(tuple(logits.shape))
        return logits

    monkeypatch.setattr(forward, "_chunk_logits", spy)
    hidden = torch.randn(300, 8, requires_grad=True)
    weight = torch.randn(5000, 8, requires_grad=True)
    out = chunked_target_logprobs(hidden, weight, torch.randint(0, 5000, (300,)), vocab_chunk=1024, row_chunk=128)
    out.sum().backward()
    assert shapes
    assert max(rows for rows, _ in shapes) <= 128
    assert max(cols for _, cols in shapes) <= 1024


@pytest.mark.parametrize("kind", [BuilderKind.PREFIX_MERGING, BuilderKind.TREE])
def test_target_logprobs_equal_the_stock_model_per_call(tiny_lm: Any, kind: BuilderKind) -> None:
    samples = synthetic_samples(SMALL_SHAPE, group_size=3, seed=5)
    expected = {}
    with torch.no_grad():
        for sample in samples:
            for call in sample.calls:
                ids = [*call.prompt_token_ids, *call.completion_token_ids]
                logits = tiny_lm(torch.tensor([ids])).logits[0]
                logprobs = torch.log_softmax(logits.float(), -1)
                for index, token in enumerate(call.completion_token_ids):
                    position = len(call.prompt_token_ids) + index
                    key = (sample.sample_index, tuple(ids[: position + 1]))
                    expected[key] = float(logprobs[position - 1, token])
    result = build_sequences(kind, samples)
    seen = 0
    for batch in pack(result.sequences, token_budget=256):
        got = target_logprobs(tiny_lm, batch, vocab_chunk=1000, attention_block=32).detach()
        for index in range(len(batch.target_tokens)):
            key = (batch.target_samples[index], target_path(batch, index))
            assert float(got[index]) == pytest.approx(expected[key], abs=2e-5)
            seen += 1
    assert seen == sum(len(call.completion_token_ids) for sample in samples for call in sample.calls)


def test_target_without_parent_raises(tiny_lm: Any) -> None:
    (batch,) = pack(
        build_sequences(BuilderKind.PER_REQUEST, synthetic_samples(SMALL_SHAPE, group_size=2)).sequences[:1], 10_000
    )
    batch.target_tokens[0] = 0
    with pytest.raises(ValueError, match="no parent"):
        target_logprobs(tiny_lm, batch)


MEMORY_PROBE = """
import ctypes, sys
from pathlib import Path
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM
from lodestar_trainer.data.batch import TrainingSequence
from lodestar_trainer.step.forward import target_logprobs
from lodestar_trainer.data.pack import pack

def rss(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

tokens, targets, vocab = 32_768, 2_048, 151_936
config = Qwen3Config(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                     num_attention_heads=1, num_key_value_heads=1, head_dim=16, max_position_embeddings=tokens)
model = Qwen3ForCausalLM(config)
sequence = TrainingSequence(
    token_ids=torch.randint(0, vocab, (tokens,)).tolist(), parents=list(range(-1, tokens - 1)),
    position_ids=list(range(tokens)), target_tokens=list(range(tokens - targets, tokens)),
    target_samples=[0] * targets, behaviour_logprobs=[-1.0] * targets, advantages=[1.0] * targets)
(batch,) = pack([sequence], tokens)
ctypes.CDLL("libc.so.6").malloc_trim(0)
Path("/proc/self/clear_refs").write_text("5")
before = rss("VmRSS")
logprobs = target_logprobs(model, batch)
logprobs.sum().backward()
assert logprobs.shape == (targets,) and model.lm_head.weight.grad is not None
print(rss("VmHWM") - before)
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_32k_tokens_with_a_151k_vocabulary_never_hold_their_logits() -> None:
    """Forward + backward of 2,048 targets on a 32,768-token sequence with Qwen's vocabulary, in a fresh
    process: its full logits would be 19.9 GB and even the targets' rows 1.2 GB (fp32); the peak RSS
    growth must stay far below the latter."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    done = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    growth = int(done.stdout.strip().splitlines()[-1])
    assert growth < 800 * 1024**2, f"peak RSS grew by {growth / 1024**2:.0f} MB"  # measured ~450 MB
