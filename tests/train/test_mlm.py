"""Masked-language modelling: BERT's 15 % / 80-10-10 recipe, loss at chosen positions, fill, refusals."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gptlab import checkpoint as ckpt
from gptlab.cli import main
from gptlab.data import prepare
from gptlab.errors import GptlabError
from gptlab.inspect.fill import fill_masks
from gptlab.model import GPT
from gptlab.tokenizers import CharTokenizer
from gptlab.train import build_config, train
from gptlab.train.objectives import MASK, make_objective, mlm_mask, with_mask_token
from tests._tiny import TINY_TRAIN, tiny_model

TEXT = "the cat sat on the mat. the dog sat on the log. " * 40


@pytest.fixture(scope="module")
def text_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlm")
    (root / "corpus.txt").write_text(TEXT, encoding="utf-8")
    prepare([root / "corpus.txt"], root / "data", block_size=16)
    return root / "data"


def test_masking_follows_berts_recipe() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 50, (200, 500))
    inputs, targets = mlm_mask(x, mask_id=50, vocab_size=51, generator=g, rate=0.15)
    chosen = targets != -1
    assert abs(chosen.float().mean().item() - 0.15) < 0.005
    assert torch.equal(targets[chosen], x[chosen])  # the original token is the target
    assert torch.equal(inputs[~chosen], x[~chosen])  # unchosen positions are untouched
    masked = (inputs == 50) & chosen
    kept = (inputs == x) & chosen
    random = chosen & ~masked & ~kept
    n = chosen.sum().item()
    assert abs(masked.sum().item() / n - 0.8) < 0.01
    # 10 % random (a random token equal to the original, 1 in 50, counts as kept) and 10 % kept
    assert abs(random.sum().item() / n - 0.1 * 49 / 50) < 0.01
    assert abs(kept.sum().item() / n - (0.1 + 0.1 / 50)) < 0.01
    assert (inputs[random] != 50).all()  # a random token is never [MASK]


def test_mask_token_is_added_once_and_encodes_as_one_id() -> None:
    tok = CharTokenizer.from_text("abc ", special_tokens=["<|endoftext|>"])
    with_mask = with_mask_token(tok)
    assert with_mask.special_tokens[MASK] == tok.vocab_size
    assert with_mask.vocab_size == tok.vocab_size + 1
    assert with_mask_token(with_mask) is with_mask
    ids = with_mask.encode(f"ab {MASK} c", allowed_special={MASK})
    assert ids.count(with_mask.special_tokens[MASK]) == 1
    assert with_mask.encode("abc") == tok.encode("abc")


def test_objective_builds_an_encoder_and_takes_the_loss_at_chosen_positions_only(text_data) -> None:
    cfg = build_config(None, [*TINY_TRAIN, "objective=mlm", "batch_size=4"])
    obj = make_objective(cfg, text_data)
    c = obj.model_config
    assert (c.arch, c.causal, c.vocab_size) == ("encoder", False, obj.data.vocab_size + 1)
    inputs, targets = obj.batch(3, 0, "cpu")
    again = obj.batch(3, 0, "cpu")
    assert all(torch.equal(a, b) for a, b in zip((inputs, targets), again, strict=True))  # resumable
    assert not torch.equal(obj.batch(4, 0, "cpu")[1], targets)
    assert (inputs == obj.mask_id).any()
    model = GPT(c)
    loss = obj.loss(model, (inputs, targets))
    logits = model(inputs)
    chosen = targets != -1
    expected = F.cross_entropy(logits[chosen], targets[chosen])
    torch.testing.assert_close(loss, expected)
    total, count = obj.eval_sum(model, "val", 2, "cpu", None)
    assert count > 0 and torch.isfinite(total)
    with pytest.raises(GptlabError, match="objective='mlm' trains arch='encoder'"):
        make_objective(build_config(None, [*TINY_TRAIN, "objective=mlm", "model.arch=decoder"]), text_data)


def test_mlm_run_fills_masks_and_refuses_to_sample(text_data, tmp_path, capsys) -> None:
    cfg = build_config(
        None, [*TINY_TRAIN, "objective=mlm", "max_steps=12", "eval_every=12", "model.pos=rope"]
    )
    result = train(cfg, text_data, tmp_path / "run")
    capsys.readouterr()
    model, tok = ckpt.load(tmp_path / "run")
    assert model.config.arch == "encoder" and MASK in tok.special_tokens
    preds, filled = fill_masks(model, tok, f"the cat {MASK}at on", top_k=3)
    assert len(preds) == 1 and len(preds[0].top) == 3
    assert sum(p for _, p in preds[0].top) <= 1.0 + 1e-6
    assert MASK not in filled and len(filled) == len("the cat sat on")
    assert main(["fill", str(tmp_path / "run"), f"{MASK}at on {MASK}at", "--top-k", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("[MASK] 1") and out[1].startswith("[MASK] 2") and len(out) == 3
    assert main(["sample", str(tmp_path / "run"), "--prompt", "the"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "masked-language model" in err[0] and "gptlab fill" in err[0]
    assert main(["fill", str(tmp_path / "run"), "no mask here"]) == 2
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "run"), "--data", str(text_data), "--max-batches", "2"]) == 0
    assert "loss" in capsys.readouterr().out  # the masked-token loss
    assert main(["eval", str(tmp_path / "run"), "--data", str(text_data), "--context", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--context is for decoder models" in err[0]
    assert result.val_loss is not None


def test_fill_refuses_a_causal_model() -> None:
    model = tiny_model(vocab_size=10, block_size=8, n_layer=1, n_head=2, n_embd=16)
    tok = with_mask_token(CharTokenizer.from_text("abcdefgh"))
    with pytest.raises(GptlabError, match="causal"):
        fill_masks(model, tok, f"ab{MASK}")
