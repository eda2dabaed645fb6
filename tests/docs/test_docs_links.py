"""Every relative link and anchor in the docs resolves.

README.md, CONTRIBUTING.md and docs/**/*.md: a link `[text](path)`, `[text](path#anchor)` or
`[text](#anchor)` outside code must name a file or folder that exists, and an anchor must be a
heading of the target file, slugged as GitHub does (lower case, punctuation dropped, spaces to
hyphens, `-1`, `-2` … for repeated headings). Links to other sites are not fetched.
"""

import re
import unicodedata
from functools import cache
from pathlib import Path

import pytest

from tests import ROOT

DOCS = sorted(
    p for p in [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").rglob("*.md")] if p.is_file()
)

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ID = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")

# Files a link may name before they exist (a guide written on another branch): none now.
PENDING: set[str] = set()  # files a link may name before they exist (none now)


# github-slugger keeps letters, marks, digits and `_`; it drops other numbers (²), punctuation but `-`, symbols
_KEPT = re.compile(r"L.|M.|Nd|Nl|Pc")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: `Datasets: `gptlab prepare`` → `datasets-gptlab-prepare`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = text.replace("`", "").lower()
    kept = [c for c in text if c in " -" or _KEPT.match(unicodedata.category(c))]
    return "".join(kept).replace(" ", "-")


def prose_lines(path: Path):
    """(line number, line) outside fenced code blocks."""
    fence = None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        stripped = line.lstrip()
        marker = re.match(r"(`{3,}|~{3,})", stripped)
        if marker:
            if fence is None:
                fence = marker.group(1)[0] * len(marker.group(1))
            elif stripped.startswith(fence):
                fence = None
            continue
        if fence is None:
            yield number, line


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose_lines(path):
        found.update(HTML_ID.findall(line))
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def links(path: Path):
    for number, line in prose_lines(path):
        for target in LINK.findall(CODE_SPAN.sub("code", line)):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            yield number, target


def broken(path: Path) -> list[str]:
    problems = []
    for number, target in links(path):
        file_part, _, anchor = target.partition("#")
        where = path if not file_part else (path.parent / file_part).resolve()
        if not where.exists():
            if where.is_relative_to(ROOT) and where.relative_to(ROOT).as_posix() in PENDING:
                continue
            problems.append(f"{path.relative_to(ROOT)}:{number}: {target}: no such file")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            problems.append(f"{path.relative_to(ROOT)}:{number}: {target}: no heading with this anchor")
    return problems


def test_slug_follows_github():
    assert slug("Datasets: `gptlab prepare INPUT... --out DIR`") == "datasets-gptlab-prepare-input---out-dir"
    assert slug("Serving: an OpenAI-compatible API") == "serving-an-openai-compatible-api"
    assert slug("Side by side (2026-11-23, 04:28–06:06 UTC)") == "side-by-side-2026-11-23-04280606-utc"
    assert slug("Where x² goes") == "where-x-goes"
    assert slug("Data preparation with workers — `bench/prepare_workers.py`") == (
        "data-preparation-with-workers--benchprepare_workerspy"
    )


def test_the_docs_exist():
    names = {p.relative_to(ROOT).as_posix() for p in DOCS}
    assert {"README.md", "CONTRIBUTING.md", "docs/benchmarks.md"} <= names


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(path):
    assert broken(path) == []


DOC_REFERENCE = re.compile(r"(?<![\w/.])((?:docs/[\w./-]+|README|CONTRIBUTING)\.md)(?:#([\w-]+))?")


def test_references_from_the_code_resolve():
    """`docs/benchmarks.md#decoding` in a docstring or comment names a file and a heading that exist."""
    problems = []
    for path in sorted((ROOT / "src").rglob("*")):
        if path.suffix not in (".py", ".toml") or not path.is_file():
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for name, anchor in DOC_REFERENCE.findall(line):
                target = ROOT / name
                where = f"{path.relative_to(ROOT)}:{number}: {name}{'#' + anchor if anchor else ''}"
                if not target.exists():
                    if name not in PENDING:
                        problems.append(f"{where}: no such file")
                elif anchor and anchor not in anchors(target):
                    problems.append(f"{where}: no heading with this anchor")
    assert problems == []
