"""Weight files that third-party loaders unpickle are checked before the loader runs.

VBench's scorers (pyiqa's MUSIQ, DINO through torch hub, CLIP's fallback, AMT, RAFT, ViCLIP, UMT) and the LPIPS
backbone (torchvision through ``torch.hub.load_state_dict_from_url``) read their checkpoints with
``torch.load(weights_only=False)``: unpickling a file runs code from it. So each file such a loader will read must
match, in this order:

  * a published SHA256 (``PUBLISHED_SHA256``: CLIP's, from OpenAI's original URLs);
  * the hash prefix in its name, torch hub's convention (``<name>-<first 8+ hex of the SHA256>.<ext>``, e.g.
    ``musiq_spaq_ckpt-358bb6af.pth``, ``alexnet-owt-7be5be79.pth``); where the bytes do not match it, the
    manifest below may still vouch for them (torchvision follows the convention; whether pyiqa's release
    files do is unverified here, and a download from the publisher must not be refused for its name);
  * otherwise the SHA256 that ``make fetch-weights`` recorded when it downloaded the file, in the manifest
    ``jensenkv-weights-manifest.json`` of the folder it downloads into (the VBench cache, the torch hub
    checkpoints folder); the nearest manifest above the file counts, so a copied folder keeps its manifest.

A changed or unknown file is refused in one line naming it (``untrusted_reason``); the caller reports the
metric missing with that line.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path

MANIFEST_NAME = "jensenkv-weights-manifest.json"
# OpenAI's CLIP files: the original URL path holds each file's SHA256 (scripts/fetch_weights.py checks downloads).
PUBLISHED_SHA256 = {
    "ViT-B-32.pt": "40d365715913c9da98579312b702a82c18be219cc2a73407c4526f58eba950af",
    "ViT-L-14.pt": "b8cca3fd41ae0c99ba7e8951adf17d267cdb84cd88be6f7c2e0eca1737a03836",
}
# torch hub's file-name hash: "-<hex>." (torch.hub.HASH_REGEX); 8 hex digits at least, so "ViT-B-32.pt" is none
NAME_HASH = re.compile(r"-([a-f0-9]{8,64})\.")


def sha256_of(path: Path) -> str:
    """SHA256 of a file, cached by (path, size, mtime): a run checks a 900 MB CLIP file once."""
    stat = Path(path).stat()
    return _sha256(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=32)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def name_hash_prefix(path: Path) -> str | None:
    """The SHA256 prefix torch hub's naming convention puts in the file name, if any."""
    match = NAME_HASH.search(Path(path).name)
    return match.group(1) if match else None


def find_manifest(path: Path) -> Path | None:
    """The nearest manifest in a folder above ``path``."""
    for folder in Path(path).resolve().parents:
        if (folder / MANIFEST_NAME).is_file():
            return folder / MANIFEST_NAME
    return None


def _read_manifest(manifest: Path) -> dict[str, dict]:
    try:
        files = json.loads(manifest.read_text()).get("files", {})
    except (OSError, ValueError, AttributeError) as e:
        raise ValueError(f"{manifest} is not a readable weights manifest ({type(e).__name__}: {e})") from None
    if not isinstance(files, dict):
        raise ValueError(f"{manifest} is not a readable weights manifest (its 'files' is not a mapping)")
    return files


def _manifest_sha(manifest: Path, path: Path) -> str | None:
    """The SHA256 ``manifest`` records for ``path`` (None: no entry); ValueError when it cannot be read."""
    entry = _read_manifest(manifest).get(path.resolve().relative_to(manifest.parent.resolve()).as_posix())
    return entry.get("sha256") if isinstance(entry, dict) else None


def record(root: Path, path: Path, source: str) -> str:
    """Add ``path``'s SHA256 (and where it came from) to ``root``'s manifest, written atomically; returns the
    SHA256. ``path`` must lie under ``root``."""
    root, path = Path(root), Path(path)
    key = path.resolve().relative_to(root.resolve()).as_posix()
    manifest = root / MANIFEST_NAME
    files = _read_manifest(manifest) if manifest.is_file() else {}
    sha = sha256_of(path)
    files[key] = {"sha256": sha, "source": source}
    root.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=root, prefix=f".{MANIFEST_NAME}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump({"format": 1, "files": dict(sorted(files.items()))}, f, indent=1)
        f.write("\n")
    os.replace(tmp, manifest)
    return sha


def untrusted_reason(path: Path) -> str | None:
    """None when ``path`` matches its published SHA256, its file-name hash or its manifest entry; otherwise one
    line naming the file and what failed. Call it before a loader that unpickles the file."""
    path = Path(path)
    refused = f"{path} refused before loading (the loader unpickles it, which runs code)"
    sha = sha256_of(path)
    published = PUBLISHED_SHA256.get(path.name)
    if published is not None:
        return None if sha == published else f"{refused}: its SHA256 {sha} is not the published {published}"
    prefix = name_hash_prefix(path)
    if prefix is not None and sha.startswith(prefix):
        return None
    manifest = find_manifest(path)
    try:
        recorded = _manifest_sha(manifest, path) if manifest is not None else None
    except ValueError as e:
        return f"{refused}: {e}"
    if prefix is not None:  # not every publisher names files by their hash: the file it served decides
        if recorded == sha:
            return None
        return (f"{refused}: its SHA256 {sha} does not start with {prefix}, the hash in its name, and no "
                f"{MANIFEST_NAME} records these bytes as downloaded from its publisher (`make fetch-weights`)")
    hint = ("`make fetch-weights` downloads and records it; `python scripts/fetch_weights.py --record-present` "
            "records a file already in place that you trust")
    if manifest is None:
        return f"{refused}: it has no published checksum and no {MANIFEST_NAME} above it records it ({hint})"
    if recorded is None:
        return f"{refused}: it has no published checksum and {manifest} does not record it ({hint})"
    if recorded != sha:
        return f"{refused}: its SHA256 {sha} differs from the {recorded} recorded in {manifest} ({hint})"
    return None
