"""Real English text a package manager provides offline, cut into token windows grouped by document.

Sources (Debian packages; ``make text`` installs them, or unpacks them under ``.text/`` without root):
- ``devil``: Ambrose Bierce, *The Devil's Dictionary* (1911), package ``dict-devil``; one document per initial
  letter of the headwords (the dictd index gives each entry's place);
- ``python_doc``: the Python 3.11 tutorial and HOWTO sources (reStructuredText), package ``python3.11-doc``;
  one document per file.

A window is L consecutive tokens of one document. Windows of one document share its content and style, so the
document is the independent unit (``report.rows.cluster_means``: windows averaged within their document).
Each source gives ``windows_per_source`` windows, dealt round-robin over its documents (sorted by name) and
evenly spaced inside each, never overlapping: the choice is a function of the text alone, no random draw.
A source's identity (``TextSource.identity``): its package, version and the sha256 of its documents' text.
"""
from __future__ import annotations

import gzip
import hashlib
import subprocess
from dataclasses import dataclass
from pathlib import Path

TEXT_ROOTS = (Path("/"), Path(".text"))  # the system, then `make text`'s unpacked packages (no root needed)
_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


@dataclass(frozen=True)
class Document:
    name: str  # "devil/A", "python_doc/tutorial/classes"
    text: str


@dataclass(frozen=True)
class TextSource:
    name: str
    package: str
    version: str
    documents: tuple[Document, ...]

    @property
    def digest(self) -> str:
        digest = hashlib.sha256()
        for doc in self.documents:
            digest.update(doc.name.encode() + b"\0" + doc.text.encode() + b"\0")
        return digest.hexdigest()[:16]

    def identity(self) -> dict:
        return {"name": self.name, "package": self.package, "version": self.version, "digest": self.digest}


class MissingTextError(FileNotFoundError):
    """A text source's package is not installed or unpacked."""


def _find(relative: str, package: str, key: str) -> Path:
    for root in TEXT_ROOTS:
        path = root / relative
        if path.exists():
            return path
    raise MissingTextError(f"{key}: {package} is not installed (looked for /{relative} and .text/{relative}); "
                           "run `make text` (apt-get as root, else the package unpacked under .text/)")


def _version(package: str) -> str:
    """The package's version: dpkg's record, else the unpacked .deb's name (.text/<package>_<version>_*.deb)."""
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True,
                             timeout=30)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    debs = sorted(Path(".text").glob(f"{package}_*.deb"))
    return debs[-1].name.split("_")[1] if debs else "unknown"


def _b64(text: str) -> int:
    value = 0
    for char in text:
        value = value * 64 + _B64.index(char)
    return value


def devil_source(key: str = "text.sources") -> TextSource:
    """The Devil's Dictionary, one document per initial letter (entries in the dictd index's order)."""
    data = gzip.open(_find("usr/share/dictd/devil.dict.dz", "dict-devil", key)).read()
    index = _find("usr/share/dictd/devil.index", "dict-devil", key).read_text(encoding="utf-8")
    letters: dict[str, list[str]] = {}
    for line in index.splitlines():
        word, offset, length = line.split("\t")
        if word.startswith("00database") or not word[:1].isalpha():
            continue
        start = _b64(offset)
        entry = data[start : start + _b64(length)].decode("utf-8", "replace").strip()
        letters.setdefault(word[0].upper(), []).append(entry)
    docs = tuple(Document(f"devil/{letter}", "\n\n".join(entries)) for letter, entries in sorted(letters.items()))
    return TextSource("devil", "dict-devil", _version("dict-devil"), docs)


def python_doc_source(key: str = "text.sources") -> TextSource:
    """The Python 3.11 tutorial and HOWTOs, one document per reStructuredText file (index pages left out)."""
    root = _find("usr/share/doc/python3.11/html/_sources", "python3.11-doc", key)
    docs = []
    for folder in ("tutorial", "howto"):
        for path in sorted((root / folder).glob("*.rst.txt")):
            if path.name != "index.rst.txt":
                docs.append(Document(f"python_doc/{folder}/{path.name[:-8]}", path.read_text(encoding="utf-8")))
    return TextSource("python_doc", "python3.11-doc", _version("python3.11-doc"), tuple(docs))


SOURCES = {"devil": devil_source, "python_doc": python_doc_source}


def load_source(name: str, key: str = "text.sources") -> TextSource:
    if name not in SOURCES:
        raise ValueError(f"{key}: {name!r} is not allowed: use names from {tuple(SOURCES)}")
    return SOURCES[name](key)


@dataclass(frozen=True)
class Window:
    source: str
    document: str
    start: int  # token offset in the document
    ids: tuple[int, ...]  # L token ids


def windows(source: TextSource, tokenizer, length: int, count: int) -> list[Window]:
    """``count`` windows of ``length`` tokens from ``source``: dealt round-robin over the documents that hold at
    least one window (sorted by name), evenly spaced and non-overlapping within each. ValueError when the source
    has room for fewer."""
    tokens = {doc.name: tokenizer(doc.text, add_special_tokens=False)["input_ids"] for doc in source.documents}
    capacity = {name: len(ids) // length for name, ids in tokens.items() if len(ids) >= length}
    if sum(capacity.values()) < count:
        raise ValueError(f"text.windows_per_source={count} is not allowed for {source.name}: its documents hold "
                         f"{sum(capacity.values())} non-overlapping windows of {length} tokens")
    share = dict.fromkeys(capacity, 0)
    while sum(share.values()) < count:
        for name in capacity:
            if share[name] < capacity[name] and sum(share.values()) < count:
                share[name] += 1
    out = []
    for name, k in share.items():
        ids = tokens[name]
        room = len(ids) - k * length  # spare tokens, spread evenly between the windows
        for i in range(k):
            start = i * length + (room * i) // max(k - 1, 1) if k > 1 else 0
            out.append(Window(source.name, name, start, tuple(ids[start : start + length])))
    return out
