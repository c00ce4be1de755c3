"""The documentation a user can reach: `docs/` inside the repository, and every citation of it.

- No text file of the repository cites notes that live outside it (the `shared` folder beside
  the checkout, or the design and reference notes kept there): whoever clones the project would
  not find them.
- Every `docs/<page>.md` path cited anywhere (code, configs, tests, notebooks, README) names a page
  that exists, and its `#anchor`, when given, is a heading of that page (GitHub's heading slugs).
- Every relative link inside `docs/` resolves, anchors included.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
PAGES = ("README.md", "architecture.md", "conventions.md", "references.md", "planning_speed.md")

# spelled in pieces so that this file does not itself contain what it forbids
FORBIDDEN = ("../" + "shared", "DESIGN" + ".md", "REFERENCES" + ".md")

# docs/<page>.md with an optional #anchor, reached from the root or from a folder below it
DOC_REF = re.compile(r"(?<![\w/.-])(?:\.\./)*docs/([A-Za-z0-9_.-]+\.md)(?:#([A-Za-z0-9_-]+))?")
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"#{1,6}\s+(.*?)\s*#*\s*$")


def github_slugs(markdown: str) -> set[str]:
    """Anchors GitHub gives the headings of a Markdown text: lower case, punctuation other than
    '-' and '_' dropped, spaces to '-'; a repeated slug gets -1, -2, ...; fenced code skipped."""
    slugs: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in markdown.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        m = HEADING.match(line)
        if fenced or m is None:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))  # a link's text only
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        slugs.add(slug if n == 0 else f"{slug}-{n}")
    return slugs


def forbidden_citations(text: str) -> list[str]:
    return [f for f in FORBIDDEN if f in text]


def repo_text_files() -> dict[Path, str]:
    """Tracked and untracked-but-not-ignored files that are UTF-8 text, by path."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO, capture_output=True, check=True).stdout
        paths = [REPO / p for p in out.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: walk the tree
        paths = [p for p in REPO.rglob("*")
                 if not any(part.startswith(".") or part == "__pycache__"
                            for part in p.relative_to(REPO).parts)]
    texts = {}
    for p in paths:
        if not p.is_file():  # tracked but deleted in the working tree
            continue
        data = p.read_bytes()
        if b"\0" in data:
            continue
        try:
            texts[p] = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
    return texts


@pytest.fixture(scope="module")
def texts() -> dict[Path, str]:
    found = repo_text_files()
    assert REPO / "README.md" in found and REPO / "dataflow" / "api.py" in found, (
        "the repository's files were not found; the checks below would pass vacuously")
    return found


def _where(path: Path, text: str, needle: str) -> str:
    line = text[:text.index(needle)].count("\n") + 1
    return f"{path.relative_to(REPO)}:{line}"


def test_slugs_follow_github():
    md = ("# How dataflow is built\n## SCALE-Sim fill and drain\n### fp32 tolerances\n"
          "## Objects that cross stages\n## Store queues\n## Store queues\n"
          "```\n# not a heading\n```\n## See [the page](x.md)\n")
    assert github_slugs(md) == {
        "how-dataflow-is-built", "scale-sim-fill-and-drain", "fp32-tolerances",
        "objects-that-cross-stages", "store-queues", "store-queues-1", "see-the-page"}


def test_citation_patterns_catch_what_they_must():
    assert forbidden_citations("see `" + FORBIDDEN[0] + "/notes`") == [FORBIDDEN[0]]
    assert forbidden_citations("docs/references.md#pit") == []
    refs = [m.groups() for m in DOC_REF.finditer(
        "x (docs/references.md#pit) [r](../docs/conventions.md) mydocs/a.md docs/README.md.")]
    assert refs == [("references.md", "pit"), ("conventions.md", None), ("README.md", None)]


def test_docs_pages_exist():
    for page in PAGES:
        assert (DOCS / page).is_file(), f"docs/{page} is missing"


def test_nothing_cites_notes_outside_the_repository(texts):
    bad = [f"{_where(p, t, f)}: cites {f!r}"
           for p, t in texts.items() for f in forbidden_citations(t)]
    assert not bad, "citations of files outside the repository:\n" + "\n".join(bad)


def test_every_cited_docs_page_and_anchor_exists(texts):
    slugs = {page: github_slugs((DOCS / page).read_text(encoding="utf-8"))
             for page in PAGES if (DOCS / page).is_file()}
    bad, cited = [], 0
    for p, t in texts.items():
        for m in DOC_REF.finditer(t):
            cited += 1
            page, anchor = m.groups()
            where = _where(p, t, m.group(0))
            if page not in slugs:
                bad.append(f"{where}: docs/{page} does not exist")
            elif anchor is not None and anchor not in slugs[page]:
                bad.append(f"{where}: docs/{page} has no heading #{anchor}")
    assert not bad, "broken citations of docs/:\n" + "\n".join(bad)
    # the code, configs and README point here; a pattern that finds nothing has broken
    assert cited >= 30, f"only {cited} citations of docs/ found"
    assert "docs/architecture.md" in texts[REPO / "README.md"]


def test_links_inside_docs_resolve(texts):
    bad = []
    for p, t in texts.items():
        if p.parent != DOCS or p.suffix != ".md":
            continue
        for m in MD_LINK.finditer(t):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (p.parent / path).resolve() if path else p
            if not dest.exists():
                bad.append(f"{_where(p, t, target)}: {target} does not exist")
            elif anchor and dest.suffix == ".md" and anchor not in github_slugs(
                    dest.read_text(encoding="utf-8")):
                bad.append(f"{_where(p, t, target)}: {target}: no such heading")
    assert not bad, "broken links in docs/:\n" + "\n".join(bad)


def test_docs_index_links_every_page():
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    for page in PAGES[1:]:
        assert f"({page})" in index, f"docs/README.md does not link {page}"
