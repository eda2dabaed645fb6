"""``KVView``: rows R of one layer's storage, written at positions P, read over [0, end)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import gptlab
from gptlab.errors import GptlabError
from gptlab.model import KVCache, KVView
from gptlab.model.kvcache import KVStore, make_store
from tests._tiny import tiny_model

B, H, T_MAX, D = 4, 2, 10, 3


def _new(n: int, t: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, H, t, D, generator=g), torch.randn(n, H, t, D, generator=g)


def _store(seed: int = 0) -> KVStore:
    store = make_store(B, H, T_MAX, D, torch.float32, "cpu")
    k, v = _new(B, T_MAX, seed)
    store.k.copy_(k)
    store.v.copy_(v)
    return store


@pytest.mark.parametrize("rows", [slice(1, 3), torch.tensor([3, 0])], ids=["range", "gather"])
def test_a_slice_of_positions_is_written_in_every_row_and_read_back(rows):
    store = _store()
    before = store.k.clone()
    k, v = _new(2, 2, 1)
    keys, values = KVView(store, rows, write=4, end=6).update(k, v)
    idx = torch.arange(B)[rows]
    torch.testing.assert_close(keys[:, :, 4:6], k, rtol=0, atol=0)
    torch.testing.assert_close(values[:, :, 4:6], v, rtol=0, atol=0)
    torch.testing.assert_close(keys[:, :, :4], before[idx, :, :4], rtol=0, atol=0)
    torch.testing.assert_close(store.k[idx, :, 4:6], k, rtol=0, atol=0)
    untouched = [r for r in range(B) if r not in idx.tolist()]
    torch.testing.assert_close(store.k[untouched], before[untouched], rtol=0, atol=0)


@pytest.mark.parametrize("rows", [slice(0, 3), torch.tensor([2, 0, 3])], ids=["range", "gather"])
def test_one_position_per_row_writes_each_row_at_its_own_position(rows):
    store = _store()
    before = store.k.clone()
    pos = torch.tensor([1, 7, 4])
    k, v = _new(3, 1, 2)
    keys, _ = KVView(store, rows, write=pos, end=T_MAX).update(k, v)
    expected = before[torch.arange(B)[rows]].clone()
    for r in range(3):
        expected[r, :, pos[r]] = k[r, :, 0]
    torch.testing.assert_close(keys, expected, rtol=0, atol=0)


def test_end_none_attends_over_the_new_keys_as_given_and_still_stores_them():
    store = make_store(2, H, T_MAX, D, torch.float32, "cpu")
    k, v = (t.to(torch.bfloat16) for t in _new(2, 3, 3))
    keys, values = KVView(store, write=0).update(k, v)
    assert keys is k and values is v  # not read back: no rounding through the store's dtype
    torch.testing.assert_close(store.k[:, :, :3], k.float(), rtol=0, atol=0)


def test_write_none_attends_after_the_stored_rows_and_stores_nothing():
    store = _store()
    before = store.k.clone()
    rows = torch.tensor([1, 1, 0])  # a row may be read by several
    k, v = _new(3, 2, 4)
    keys, values = KVView(store, rows, end=5).update(k, v)
    torch.testing.assert_close(keys, torch.cat([before[rows, :, :5], k], dim=2), rtol=0, atol=0)
    assert values.shape == (3, H, 7, D)
    torch.testing.assert_close(store.k, before, rtol=0, atol=0)


def test_an_int8_store_reads_back_close_to_what_was_written():
    store = make_store(1, H, T_MAX, D, torch.int8, "cpu")
    k, v = _new(1, 4, 5)
    keys, _ = KVView(store, write=0, end=4).update(k, v)
    assert keys.dtype == torch.float32
    assert (keys - k).abs().max() <= k.abs().max() / 127


def test_a_kv_cache_appends_each_pass_and_refuses_past_its_length():
    model = tiny_model()
    cache = KVCache(model.config, batch=1, max_len=6)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7]])
    with torch.no_grad():
        model.run(ids[:, :4], cache=cache)
        assert cache.length == 4
        assert [(view.write, view.end) for view in cache] == [(0, 4)] * len(cache)
        model.run(ids[:, 4:6], cache=cache)
        assert cache.length == 6 and cache[0].end == 6
        with pytest.raises(GptlabError, match="KV cache is full"):
            model.run(ids[:, 6:], cache=cache)


@pytest.mark.parametrize("tokens", [1, 7])
def test_a_bf16_pass_over_a_float32_cache_attends_in_float32_whatever_its_length(tokens):
    """bf16 weights over a float32 cache (the CPU's default): a decode step's one query and a prompt's
    many attend in float32, ``softmax(QKᵀ/√d_k)·V`` over the stored values, the probabilities never
    rounded to bf16 (that rounding changed greedy texts)."""
    import torch.nn.functional as F

    model = tiny_model(pos="rope", n_kv_head=2).to(torch.bfloat16)
    attn, cfg = model.blocks[0].attn, model.config
    x = torch.randn(1, tokens, cfg.n_embd, generator=torch.Generator().manual_seed(3)).bfloat16()
    pos = torch.arange(tokens)
    cache = KVCache(cfg, batch=1, max_len=16, dtype=torch.float32)
    cache.advance(tokens)
    with torch.no_grad():
        got, _ = attn(x, pos, model.positional, cache=cache[0])
        q, k, v = attn.qkv(x).split([attn.q_dim, attn.kv_dim, attn.kv_dim], dim=-1)
        q = q.view(1, tokens, attn.n_head, -1).transpose(1, 2)
        k = k.view(1, tokens, attn.n_kv_head, -1).transpose(1, 2)
        v = v.view(1, tokens, attn.n_kv_head, -1).transpose(1, 2)
        q, k = model.positional.rotate(q, k, pos)
        rep = attn.n_head // attn.n_kv_head
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)

        def attend(dtype: torch.dtype) -> torch.Tensor:
            y = F.scaled_dot_product_attention(q.to(dtype), k.to(dtype), v.to(dtype), is_causal=True)
            return attn.proj(y.transpose(1, 2).reshape(1, tokens, attn.q_dim).bfloat16())

        want, rounded = attend(torch.float32), attend(torch.bfloat16)
    assert torch.equal(got, want)
    if tokens > 1:  # the bf16 kernel rounds the probabilities; the float32 pass does not
        assert not torch.equal(got, rounded)


def test_update_is_written_once_in_the_package():
    """One protocol, one view type: no other class in gptlab has a per-layer ``update(k, v)``."""
    root = Path(gptlab.__file__).parent
    owners = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if (
                        isinstance(item, ast.FunctionDef)
                        and item.name == "update"
                        and [a.arg for a in item.args.args] == ["self", "k", "v"]
                    ):
                        owners.append(f"{path.relative_to(root).as_posix()}:{node.name}")
    assert owners == ["model/kvcache.py:LayerCache", "model/kvcache.py:KVView"]
