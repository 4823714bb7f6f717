"""The documentation's references hold: what the README, docs/ and comments point to exists.

- Nothing points to a file a user does not have (the private spec, the background folder beside
  the checkout) or to this project's issue numbers; definitions are cited as
  ``docs/definitions.md#<heading>``.
- Every such citation, anywhere in the repository, names a heading that exists.
- Relative links in README.md, docs/ and benchmarks/ resolve to files in the repository, with their
  anchors; repository paths the docs name in backticks exist.
- Every Markdown file renders as written: no table is cut short by a paragraph (its later rows
  would show as text), no lead-in ending in ":" is left without the list, table or code it
  introduces; facts the docs quote (a printed line, the idempotency key, the dashboards' rows)
  match the code.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
THIS_FILE = Path(__file__).resolve()

TEXT_SUFFIXES = frozenset({".py", ".md", ".yml", ".yaml", ".toml", ".c", ".cfg", ".sh", ".json"})
EXTRA_TEXT_FILES = ("dev",)  # text files without a suffix
# Tests and benchmarks read the real traces beside the checkout at run time, and CI puts them
# there: only these may name that folder.
RUNTIME_SHARED_USERS = ("tests", "benchmarks", ".ci")
TOP_LEVEL_DIRS = (
    "agent",
    "benchmarks",
    "cli",
    "collector",
    "core",
    "dashboards",
    "deploy",
    "docs",
    "exporters",
    "integrations",
    "tests",
)

# Written in two pieces so that this file does not match its own patterns.
SHARED_DIR = "../" + "shared"
SPEC_WORD = re.compile(r"\b" + "DES" + r"IGN\b")
ISSUE_REF = re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE)
WORD_BEFORE = re.compile(r"([\w./-]*)[\s(\[,;:]*$")
# Issues of other projects may be cited when the citation names the project ("hwloc issue #574").
UPSTREAM_PROJECTS = frozenset(
    {"hwloc", "nccl", "nccl-tests", "rccl", "pytorch", "torch", "kineto", "prometheus", "grafana"}
)
DOC_CITATION = re.compile(r"docs/([\w-]+\.md)#([\w-]+)")
RESULTS_CITATION = re.compile(r"benchmarks/RESULTS\.md#([\w-]+)")
MD_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`[^`\n]+`")


def _repository_files() -> list[str]:
    """The repository's files: tracked plus untracked, not ignored (no venv, caches, outputs)."""
    git = shutil.which("git")
    if git and (ROOT / ".git").exists():
        listed = subprocess.run(
            [git, "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        return listed.stdout.splitlines()
    # Not a git checkout (an unpacked source archive): every file outside hidden and build folders.
    skipped = {"build", "dist", "__pycache__"}
    return [
        path.relative_to(ROOT).as_posix()
        for path in ROOT.rglob("*")
        if not any(
            (part.startswith(".") and part != ".ci") or part in skipped or part.endswith("-info")
            for part in path.relative_to(ROOT).parts[:-1]
        )
    ]


def _text_files() -> Iterator[Path]:
    for name in sorted(_repository_files()):
        path = ROOT / name
        if not path.is_file() or path.resolve() == THIS_FILE:
            continue
        if path.suffix in TEXT_SUFFIXES or name in EXTRA_TEXT_FILES:
            yield path


def _markdown_files() -> list[Path]:
    return [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "benchmarks").glob("*.md")),
    ]


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def own_issue_refs(text: str) -> list[str]:
    """References to an issue number that do not name another project."""
    found = []
    for match in ISSUE_REF.finditer(text):
        before = WORD_BEFORE.search(text[: match.start()])
        word = before.group(1).lower() if before else ""
        if word not in UPSTREAM_PROJECTS and "/" not in word:
            found.append(match.group(0))
    return found


def slug(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces to -."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _prose_lines(markdown: str) -> Iterator[str]:
    """The lines of a Markdown text outside fenced code blocks."""
    in_fence = False
    for line in markdown.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            yield line


def anchors(markdown_path: Path) -> set[str]:
    """Every heading anchor of a Markdown file (repeated headings get -1, -2, ... as on GitHub)."""
    seen: dict[str, int] = {}
    result = set()
    for line in _prose_lines(markdown_path.read_text(encoding="utf-8")):
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def _markdown_links(path: Path) -> Iterator[str]:
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        yield from MD_LINK.findall(INLINE_CODE.sub("", line))


@pytest.mark.parametrize(
    ("text", "refs"),
    [
        ("Targets (issue 5): 4,096 ranks", ["issue 5"]),
        ("peak precedence, issue 3", ["issue 3"]),
        ("issue 2 asks for it", ["issue 2"]),
        ("see Issue #12 and issues 13", ["Issue #12", "issues 13"]),
        ("the per-link rate (hwloc issue #574)", []),
        ("NVIDIA/nccl-tests issues #29 and #119", []),
        ("an issue with the trace", []),
    ],
)
def test_issue_references_are_told_from_upstream_citations(text: str, refs: list[str]) -> None:
    assert own_issue_refs(text) == refs


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("MFU and HFU", "mfu-and-hfu"),
        ("Why the waterfall holds", "why-the-waterfall-holds"),
        ("Alpha-beta fit", "alpha-beta-fit"),
        ("`mfuscope calc`", "mfuscope-calc"),
        (
            "JSON (`--json`, schema `mfuscope.analysis/1`; base units)",
            "json---json-schema-mfuscopeanalysis1-base-units",
        ),
    ],
)
def test_heading_anchors_follow_github(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


@pytest.mark.slow  # git in a child process
def test_no_reference_to_files_users_lack_or_to_issue_numbers() -> None:
    problems = []
    for path in _text_files():
        rel = _rel(path)
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), start=1):
            where = f"{rel}:{number}"
            if SPEC_WORD.search(line):
                problems.append(f"{where}: cites the private spec: {line.strip()}")
            if SHARED_DIR in line and not rel.startswith(RUNTIME_SHARED_USERS):
                problems.append(f"{where}: points outside the repository: {line.strip()}")
            for ref in own_issue_refs(line):
                problems.append(f"{where}: cites an issue number ({ref}): {line.strip()}")
    assert not problems, "\n".join(problems)


@pytest.mark.slow  # git in a child process
def test_every_cited_definition_heading_exists() -> None:
    cited = 0
    problems = []
    for path in _text_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), start=1):
            for doc, anchor in DOC_CITATION.findall(line):
                cited += 1
                target = ROOT / "docs" / doc
                if not target.exists():
                    problems.append(f"{_rel(path)}:{number}: docs/{doc} does not exist")
                elif anchor not in anchors(target):
                    problems.append(f"{_rel(path)}:{number}: docs/{doc} has no heading #{anchor}")
    assert cited > 0, "the code cites no definition at all: the pattern no longer matches"
    assert not problems, "\n".join(problems)


@pytest.mark.slow  # git in a child process
def test_every_cited_benchmark_result_exists() -> None:
    # Docstrings and guides cite measurements as benchmarks/RESULTS.md#<heading>.
    headings = anchors(ROOT / "benchmarks" / "RESULTS.md")
    cited = 0
    problems = []
    for path in _text_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), start=1):
            for anchor in RESULTS_CITATION.findall(line):
                cited += 1
                if anchor not in headings:
                    problems.append(f"{_rel(path)}:{number}: RESULTS.md has no #{anchor}")
    assert cited > 0, "nothing cites benchmarks/RESULTS.md: the pattern no longer matches"
    assert not problems, "\n".join(problems)


def test_definitions_cover_every_quantity() -> None:
    # The quantities the code cites, each with its own heading.
    required = {
        "step-window",
        "step-buckets",
        "exposed-communication",
        "overlapped-communication",
        "bubble",
        "pipeline-bubble",
        "bucket-invariant",
        "mfu-and-hfu",
        "peak-flops",
        "mfu-waterfall",
        "kernel-efficiency",
        "why-the-waterfall-holds",
        "bus-bandwidth",
        "bus-factors",
        "bandwidth-efficiency",
        "tiers",
        "tp-spanning-hosts",
        "alpha-beta-model",
        "alpha-beta-fit",
        "stragglers",
        "own-time",
        "straggler-ratio",
        "counters-and-gauges",
        "job-mfu",
    }
    assert required <= anchors(ROOT / "docs" / "definitions.md")


def test_relative_links_in_readme_and_docs_resolve() -> None:
    problems = []
    checked = 0
    for path in _markdown_files():
        for target in _markdown_links(path):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            checked += 1
            file_part, _, anchor = target.partition("#")
            resolved = (path.parent / file_part).resolve() if file_part else path
            if not resolved.exists():
                problems.append(f"{_rel(path)}: link to {target}: {file_part} does not exist")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                problems.append(f"{_rel(path)}: link to {target}: no heading #{anchor}")
    assert checked > 0
    assert not problems, "\n".join(problems)


def test_repository_paths_named_in_the_docs_exist() -> None:
    pattern = re.compile(r"`((?:" + "|".join(TOP_LEVEL_DIRS) + r")/[\w./-]*)`")
    problems = []
    for path in _markdown_files():
        for line in _prose_lines(path.read_text(encoding="utf-8")):
            for name in pattern.findall(line):
                if "*" not in name and not (ROOT / name).exists():
                    problems.append(f"{_rel(path)}: names {name}, which does not exist")
    assert not problems, "\n".join(problems)


def _rendered(path: Path) -> list[Any]:
    """The block tokens of a Markdown file as GitHub renders it (CommonMark with tables)."""
    from markdown_it import MarkdownIt

    return list(MarkdownIt("commonmark").enable("table").parse(path.read_text(encoding="utf-8")))


def broken_tables(tokens: Sequence[Any]) -> list[str]:
    """Table rows rendered as paragraph text: a table interrupted by a paragraph, whose later
    rows then read as one run of text."""
    found = []
    for index, token in enumerate(tokens):
        if token.type != "paragraph_open":
            continue
        rows = [
            line
            for line in tokens[index + 1].content.splitlines()
            if re.match(r"\s*\|.*\|\s*$", line)
        ]
        if rows:
            first_line = (token.map[0] + 1) if token.map else "?"
            found.append(f"line {first_line}: {len(rows)} table rows read as text: {rows[0][:60]}")
    return found


def dangling_lead_ins(tokens: Sequence[Any]) -> list[str]:
    """Top-level paragraphs ending in ":" followed by another paragraph, a heading or nothing,
    instead of the list, table or code block they announce."""
    found = []
    for index, token in enumerate(tokens):
        if token.type != "paragraph_close" or token.level != 0:
            continue
        text = tokens[index - 1].content.rstrip()
        following = tokens[index + 1].type if index + 1 < len(tokens) else None
        if text.endswith(":") and following in (None, "paragraph_open", "heading_open"):
            found.append(f"{text[-60:]!r} is followed by {following or 'the end of the file'}")
    return found


def test_a_table_broken_by_a_paragraph_is_found() -> None:
    from markdown_it import MarkdownIt

    split = "| a | b |\n|---|---|\n| 1 | 2 |\n\nA paragraph.\n| 3 | 4 |\n| 5 | 6 |\n"
    tokens = list(MarkdownIt("commonmark").enable("table").parse(split))
    assert len(broken_tables(tokens)) == 1
    whole = "| a | b |\n|---|---|\n| 1 | 2 |\n| 3 | 4 |\n\nA paragraph.\n"
    assert broken_tables(list(MarkdownIt("commonmark").enable("table").parse(whole))) == []


@pytest.mark.parametrize("path", _markdown_files(), ids=_rel)
def test_markdown_renders_as_written(path: Path) -> None:
    tokens = _rendered(path)
    problems = broken_tables(tokens) + dangling_lead_ins(tokens)
    assert not problems, "\n".join(problems)


def test_the_idempotency_key_is_given_with_the_incarnation() -> None:
    # The collector deduplicates on (job, incarnation, rank, step); a key quoted without the
    # incarnation would say a relaunch's re-run steps are duplicates.
    stale = re.compile(r"\(job, rank, step\)")
    problems = [
        f"{_rel(path)}: {line.strip()}"
        for path in _markdown_files()
        for line in _prose_lines(path.read_text(encoding="utf-8"))
        if stale.search(line)
    ]
    assert not problems, "\n".join(problems)


def test_the_readme_quotes_the_validate_gpu_skip_line_as_printed() -> None:
    from mfuscope.cli.validate_gpu import SKIPPED_MESSAGE

    assert f"`{SKIPPED_MESSAGE}`" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_operations_doc_names_every_row_of_the_job_dashboard() -> None:
    import json

    dashboard = json.loads((ROOT / "dashboards" / "mfuscope-job.json").read_text())
    rows = [p["title"] for p in dashboard["panels"] if p.get("type") == "row"]
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    start = text.index("**mfuscope / Job**")
    bullet = " ".join(text[start : text.index("\n- **", start)].split())
    assert rows and [r for r in rows if f"**{r}**" not in bullet] == []
