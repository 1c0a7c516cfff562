"""`lodestar export --checkpoint`: a LoRA checkpoint's adapter alone (peft loads it) and merged onto its base
(transformers loads it as a plain model); both compute what the trained LoRA model computes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lodestar_app.cli.main import main
from tests.trainer.groups_helpers import make_group
from tests.trainer.helpers import trainer_for

LORA = {"enabled": True, "rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}


def test_export_adapter_alone_and_merged(
    trainer_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    trainer, _ = trainer_for(
        trainer_model_dir, tmp_path, [make_group(1)], steps=1, checkpoint_every=1, lora=LORA, lr=5e-2
    )
    trainer.run()
    saved = Path(trainer.board.snapshot().last_checkpoint)
    ids = torch.tensor([[3, 5, 7, 11, 13, 17]])
    with torch.no_grad():
        want = trainer.model.eval()(ids).logits
        base = AutoModelForCausalLM.from_pretrained(trainer_model_dir, dtype=torch.float32)
        assert (base(ids).logits - want).abs().max() > 1e-4  # the step moved the adapter

    assert main(["export", "--checkpoint", str(saved), "--out", str(tmp_path / "merged"), "--merged"]) == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)
    assert (tmp_path / "merged" / "tokenizer.json").is_file()
    assert main(["export", "--checkpoint", str(saved), "--out", str(tmp_path / "adapter")]) == 0
    peft_model = PeftModel.from_pretrained(base, str(tmp_path / "adapter"))
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, want, atol=1e-5)
        assert torch.allclose(peft_model(ids).logits, want, atol=1e-5)
    assert str(tmp_path / "merged") in capsys.readouterr().out


def test_export_refuses_what_is_not_an_adapter(trainer_model_dir: Path, tmp_path: Path) -> None:
    assert main(["export", "--checkpoint", str(trainer_model_dir), "--out", str(tmp_path / "x")]) == 2
    assert main(["export", "--checkpoint", str(trainer_model_dir)]) == 2
