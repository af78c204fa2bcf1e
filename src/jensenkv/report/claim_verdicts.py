"""The verdicts of a ``claims.md``, keyed by where they stand, so two reports' verdicts can be compared one by one.

A verdict is: a claim heading's bold summary ("### Claim 2 (PSNR): ... — **inconclusive: ...**"), a cell of a
table's ``verdict`` column (keyed by the table's section and the row's first cell), the primary endpoint's bold
conclusion, and each "above / within the floor" of the effects against the noise floor. Decimal numbers inside a
verdict ("uncorrected already within the margin: 0.0101") are masked: they are numbers, judged in the tables.
"""
from __future__ import annotations

import re

NUMBER = re.compile(r"[-+]?\d+\.\d+(?:e[-+]?\d+)?")
HEADING = re.compile(r"^(#{2,4}) (.*?)(?: — \*\*(.+)\*\*)?$")
ENDPOINT = re.compile(r"^(d\S+) = .*?: \*\*(.+?)\*\*")
FLOOR = re.compile(r"^- (claim .+?), (.+?): .*: (above|within) the floor$")


def _mask(text: str) -> str:
    return NUMBER.sub("#", text.strip())


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def verdicts(text: str) -> dict[str, str]:
    """{"<section> | <what>": verdict} of every verdict in a claims report's markdown."""
    out: dict[str, str] = {}
    sections = {2: "", 3: "", 4: ""}
    header: list[str] | None = None
    for line in text.splitlines():
        heading = HEADING.match(line)
        if heading:
            level = len(heading.group(1))
            sections[level] = heading.group(2).strip()
            for deeper in range(level + 1, 5):
                sections[deeper] = ""
            if heading.group(3):
                out[f"{_where(sections)} | summary"] = _mask(heading.group(3))
            header = None
            continue
        if line.startswith("|"):
            cells = _cells(line)
            if header is None:
                header = cells
            elif "verdict" in header and not set("".join(cells)) <= set(":- "):
                row = dict(zip(header, cells))
                out[f"{_where(sections)} | {cells[0]}"] = _mask(row.get("verdict", ""))
            continue
        header = None
        for pattern in (ENDPOINT, FLOOR):
            found = pattern.match(line)
            if found:
                *what, verdict = found.groups()
                out[f"{_where(sections)} | {' '.join(what)}"] = _mask(verdict)
    return out


def _where(sections: dict[int, str]) -> str:
    return " / ".join(s for s in sections.values() if s)


def changed(committed: str, rerun: str) -> list[str]:
    """One line per verdict that differs, appeared or vanished between two claims reports."""
    a, b = verdicts(committed), verdicts(rerun)
    lines = [f"{key}: {a[key]!r} -> {b[key]!r}" for key in a if key in b and a[key] != b[key]]
    lines += [f"{key}: only in the committed file" for key in a if key not in b]
    lines += [f"{key}: only in the rerun" for key in b if key not in a]
    return lines
