"""``bench/`` keeps the scripts whose figures the benchmark pages cite: a script no page names is a
one-off investigation, to be folded into a dated log of docs/benchmarks.md and removed."""

from __future__ import annotations

from tests import ROOT


def test_every_bench_script_is_cited_by_a_benchmark_page():
    pages = [ROOT / "docs" / "benchmarks.md", *sorted((ROOT / "docs" / "benchmarks").glob("*.md"))]
    text = "\n".join(p.read_text(encoding="utf-8") for p in pages)
    scripts = [p.name for p in (ROOT / "bench").glob("*.py") if p.name != "__init__.py"]
    assert len(scripts) > 10  # the folder was found
    assert [s for s in scripts if f"bench/{s}" not in text] == []
