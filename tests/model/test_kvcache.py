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


def test_a_prompt_through_a_float32_cache_computes_what_the_uncached_forward_does():
    """bf16 weights over a float32 cache (the CPU's default): a prompt's pass attends in bf16 over the
    values it stored, so its logits are the forward pass's without a cache, bit for bit; the next
    token's (one query, float32) stay close."""
    model = tiny_model().to(torch.bfloat16)
    ids = torch.tensor([[5, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        whole = model.run(ids).logits
        prompt = model.run(
            ids[:, :7]
        ).logits  # the same shapes as the prefill's (a GEMM of other rows may round otherwise)
        cache = KVCache(model.config, batch=1, max_len=16, dtype=torch.float32)
        prefill = model.run(ids[:, :7], cache=cache).logits
        step = model.run(ids[:, 7:], cache=cache).logits
    assert torch.equal(prefill, prompt)
    assert torch.allclose(step.float(), whole[:, 7:].float(), atol=0.1)


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
