"""``bench/sampler.py`` runs and prints its one JSON line: a time for every option and vocabulary asked."""

from __future__ import annotations

import json
import subprocess
import sys

from tests import ROOT


def test_the_sampler_benchmark_prints_one_json_line_per_option_and_vocabulary():
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "sampler.py"), "--vocab", "65,3000", "--calls", "5",
         "--rounds", "1", "--evict-mb", "1", "--threads", "1"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (line,) = done.stdout.strip().splitlines()
    times = json.loads(line)["us_per_token"]
    expected = {
        f"{o}@{v}"
        for o in ("greedy", "temperature", "cool", "top_p", "top_k", "llama_cli")
        for v in (65, 3000)
    }
    assert set(times) == expected and all(t > 0 for t in times.values())


def test_the_sampler_benchmark_times_whole_decodes_and_what_lies_outside_the_step(
    tmp_path, tiny_model, char_tok
):
    import gptlab

    model = tiny_model(pos="rope", vocab_size=char_tok.vocab_size)
    checkpoint = gptlab.save(model, char_tok, tmp_path / "tiny")
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "sampler.py"), "--vocab", "65", "--calls", "2", "--rounds", "1",
         "--evict-mb", "1", "--threads", "1", "--options", "greedy,llama_cli", "--decode", str(checkpoint)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for figure in ("decode_tokens_per_s", "us_outside_the_step"):
        assert set(out[figure]) == {"greedy", "llama_cli"} and all(v > 0 for v in out[figure].values())
