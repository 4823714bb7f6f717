"""Prometheus rule files as data, and their YAML text with the comments that explain each rule.

The text is written by hand here rather than by a YAML library so that the comments stay next to
the rules they explain. Expressions are single lines (`mfuscope.core.promql.syntax`); a long one
is folded (``>-``) at single spaces, which YAML joins back with one space, so the file loads to
exactly the expressions it was written from (a test checks).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["Group", "Rule", "Section", "render", "without_fresh_reads"]

WIDTH = 100
# A plain YAML scalar may not hold these, nor start with an indicator character.
_UNSAFE_PLAIN = re.compile(r": | #|^[^A-Za-z0-9(]|:$")
# PromQL's binary operators where a long expression is best broken, by precedence (lowest first).
_PRECEDENCE = {"or": 0, "and": 1, "unless": 1, "+": 2, "-": 2, "*": 3, "/": 3}
# Words kept on one line with the word after them.
_GLUED = (">", "<", ">=", "<=", "==", "!=", "offset")
_QUOTED = re.compile(r'"[^"]*"')


@dataclass(frozen=True)
class Rule:
    """One recording rule; `comment` is prose shown above it (a newline starts a new line)."""

    record: str
    expr: str
    comment: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if "\n" in self.expr or "  " in self.expr or self.expr != self.expr.strip():
            raise ValueError(f"{self.record}: an expression is one line with single spaces")


@dataclass(frozen=True)
class Section:
    """A heading between rules (``# --- title ---``), with optional prose under it."""

    title: str
    comment: str = ""


@dataclass(frozen=True)
class Group:
    """A rule group. Its rules run in order, but a rule reading the result of one above it reads
    that evaluation's result on Prometheus and the previous one's on vmalert: see
    `without_fresh_reads`."""

    name: str
    items: Sequence[Rule | Section]
    comment: str = ""

    @property
    def rules(self) -> tuple[Rule, ...]:
        return tuple(item for item in self.items if isinstance(item, Rule))


def _comment(text: str, indent: int) -> list[str]:
    pad = " " * indent
    lines: list[str] = []
    for paragraph in text.split("\n"):
        wrapped = textwrap.wrap(
            paragraph,
            width=WIDTH - indent - 2,
            break_long_words=False,
            break_on_hyphens=False,
        )
        lines += [f"{pad}# {line}" for line in wrapped] or [f"{pad}#"]
    return lines


def _folded(words: list[str], width: int) -> list[str]:
    """`words` in lines of at most `width`: broken before the binary operators of the shallowest
    nesting and the lowest precedence that the part has (so ``a / (b > 0) or c`` breaks before
    ``or`` first), recursively; a part without operators is filled greedily, never between a
    comparison (or ``offset``) and its operand. Words are never split."""
    text = " ".join(words)
    if len(text) <= width:
        return [text]
    depth = 0
    splits: dict[tuple[int, int], list[int]] = {}
    for index, word in enumerate(words):
        if index and word in _PRECEDENCE:
            splits.setdefault((depth, _PRECEDENCE[word]), []).append(index)
        bare = _QUOTED.sub("", word)
        depth += bare.count("(") - bare.count(")")
    if not splits:
        glued = text
        for word in _GLUED:
            glued = glued.replace(f" {word} ", f" {word}\0")
        lines = textwrap.wrap(glued, width=width, break_long_words=False, break_on_hyphens=False)
        return [line.replace("\0", " ") for line in lines]
    bounds = [0, *splits[min(splits)], len(words)]
    return [
        line
        for start, end in itertools.pairwise(bounds)
        for line in _folded(words[start:end], width)
    ]


def _expr(expr: str, indent: int) -> list[str]:
    pad = " " * indent
    # Plain only where YAML cannot read it as anything but text: a call or a grouping (never a
    # bare word such as `on` or a number, which YAML would read as a boolean or a number).
    plain = "(" in expr and not _UNSAFE_PLAIN.search(expr)
    if plain and len(pad) + len("expr: ") + len(expr) <= WIDTH:
        return [f"{pad}expr: {expr}"]
    body = _folded(expr.split(" "), WIDTH - indent - 2)
    return [f"{pad}expr: >-", *(f"{pad}  {line}" for line in body)]


def _rule(rule: Rule, indent: int) -> list[str]:
    pad = " " * indent
    lines = _comment(rule.comment, indent) if rule.comment else []
    lines.append(f"{pad}- record: {rule.record}")
    lines += _expr(rule.expr, indent + 2)
    if rule.labels:
        lines.append(f"{pad}  labels:")
        lines += [f"{pad}    {key}: {json.dumps(value)}" for key, value in rule.labels.items()]
    return lines


def _section(section: Section, indent: int) -> list[str]:
    head = f"{' ' * indent}# --- {section.title} "
    lines = [head + "-" * max(3, WIDTH - len(head))]
    return lines + (_comment(section.comment, indent) if section.comment else [])


def render(header: str, groups: Sequence[Group]) -> str:
    """The rule file's text: `header` as a comment, then the groups."""
    lines = [*_comment(header, 0), "groups:"]
    for index, group in enumerate(groups):
        if index:
            lines.append("")
        if group.comment:
            lines += _comment(group.comment, 2)
        lines += [f"  - name: {group.name}", "    rules:"]
        for item in group.items:
            lines += _rule(item, 6) if isinstance(item, Rule) else _section(item, 6)
    return "\n".join(lines) + "\n"


def _reads(name: str) -> re.Pattern[str]:
    """A read of series `name` as an instant vector, with its matchers if any: not a longer
    name, not a range (`name[1h]`: history, which every engine has alike)."""
    return re.compile(
        rf"(?<![a-zA-Z0-9_:]){re.escape(name)}(?![a-zA-Z0-9_:])(\{{[^}}]*\}})?(?!\s*\[|\{{)"
    )


_MATCHER = re.compile(r'^\s*([a-zA-Z_]\w*)\s*(=|!=)\s*"([^"]*)"\s*$')


def _selected(expr: str, matchers: str | None) -> str:
    """`expr` as a read of its series with `matchers` (``{a="v", b!="w"}``) would see it: each
    equality kept with ``and on (a)`` a one-element vector labelled a="v", each inequality
    removed with ``unless on (b)`` (a regular expression has no such form: ValueError)."""
    out = f"({expr})"
    for part in (matchers or "{}")[1:-1].split(","):
        if not part.strip():
            continue
        found = _MATCHER.match(part)
        if found is None:
            raise ValueError(f"cannot inline the matcher {part.strip()!r}")
        label, op, value = found.groups()
        keep = "and" if op == "=" else "unless"
        out = f'({out} {keep} on ({label}) label_replace(vector(1), "{label}", "{value}", "", ""))'
    return out


def _after_modifier(match: re.Match[str], inlined: str) -> str:
    """`inlined` where `match` was: after a bare ``group_left``/``group_right`` an empty label
    list first, or PromQL would read the parenthesised expression as the list of labels."""
    before = match.string[: match.start()].rstrip()
    if before.endswith(("group_left", "group_right")):
        return f"() {inlined}"
    return inlined


def without_fresh_reads(group: Group) -> Group:
    """`group` with every instant read of a series an earlier rule of the group records replaced
    by that rule's expression, in parentheses (a read's label matchers become `and`/`unless` on
    the label). Prometheus evaluates a group's rules in order and a rule reads the same
    evaluation's results of the rules above it; vmalert writes its results to the store
    asynchronously, so there the same rule reads the *previous* evaluation's value next to fresh
    raw series, and a ratio of the two leaves 0..1 while the rates move
    (docs/fleet.md#metricsql-and-the-rules). Inlined, both engines compute each rule from the
    raw series. Ranges over a recorded series (``last_over_time(x[1h])``) stay: they read
    history. A rule with its own labels cannot be inlined (its series carry them): ValueError."""
    expanded: dict[str, Rule] = {}
    items: list[Rule | Section] = []
    for item in group.items:
        if isinstance(item, Rule):
            expr = item.expr
            for name, earlier in expanded.items():
                pattern = _reads(name)
                if pattern.search(expr):
                    if earlier.labels:
                        raise ValueError(f"{item.record} reads {name}, which sets labels")
                    expr = pattern.sub(
                        lambda m, e=earlier.expr: _after_modifier(m, _selected(e, m.group(1))),  # type: ignore[misc]
                        expr,
                    )
            item = dataclasses.replace(item, expr=expr)
            expanded[item.record] = item
        items.append(item)
    return dataclasses.replace(group, items=tuple(items))
