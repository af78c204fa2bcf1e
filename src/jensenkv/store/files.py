"""Files of the results store: atomic writes (a temporary file next to the target, then ``os.replace``, so a crash
never leaves a half-written file behind), JSON in and out, file hashes, and one-line messages for a folder that
cannot be written. What a killed writer leaves (``.*.tmp``, ``.tmp/``) is found by ``tmp_files``."""
from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from jensenkv.store.record import DIGEST, CorruptRecordError, content_digest

TMP_DIR = ".tmp"               # a run's temporary files: never inside videos/, which VBench scores whole
_FILE_DIGESTS: dict[tuple, str] = {}  # sha256 by (path, stat): a process hashes an unchanged file once
_FILE_DIGESTS_KEPT = 200_000


class ResultsWriteError(ValueError):
    """The results directory cannot be written (read-only, full, a file in the way): one line, no traceback."""


WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST,
                errno.EISDIR)


def describe_write_error(error: OSError, root: str | os.PathLike, key: str = "paths.results_dir") -> str:
    """One line saying why writing under the folder ``root`` (set by ``key``) failed and what to do."""
    where = error.filename or root
    setting = f"{key}={str(root)!r}"
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left on the device (or quota) writing {where}: free space or point {setting} elsewhere"
    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        what = "the results directory" if key == "paths.results_dir" else "that folder"
        return f"cannot write {where}: {what} is read-only; point {setting} at a writable folder"
    if error.errno in (errno.ENOTDIR, errno.EEXIST, errno.EISDIR):
        return f"{setting} must be a directory, but a file is in the way at {where}"
    return f"cannot write {where} ({error.strerror or error}); check {setting}"


# --- atomic writes -----------------------------------------------------------------------------------
def atomic_write(path: str | os.PathLike, write: Callable[[Any], None], mode: str = "wb") -> Path:
    """Call ``write(file)`` on a temporary file next to ``path``, then ``os.replace`` it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp creates 0600: results are shared files
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def check_output_file(path: str | os.PathLike, setting: str) -> None:
    """Fail in one line naming ``setting`` when ``path`` cannot be written: it is a folder, a file is in the way
    of its folder, or its nearest existing folder refuses a new file (checked before any heavy work)."""
    from jensenkv.checks import fail

    path = Path(path)
    if path.is_dir():
        fail(setting, str(path), "it is a folder: give a file path")
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        fail(setting, str(path), f"{folder} is a file, not a folder: give a path in a writable folder")
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".probe.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        fail(setting, str(path), f"its folder {folder} cannot be written ({e.strerror or e}): give a path in a "
                                 "writable folder")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def tmp_files(folder: Path) -> list[Path]:
    """Temporary files under ``folder``: ``atomic_write``'s ``.*.tmp``, the ``.tmp/`` folder and older
    ``videos/.*.tmp.mp4``."""
    if not folder.is_dir():
        return []
    found = [*folder.rglob(".*.tmp"), *folder.rglob(".*.tmp.mp4"), *folder.glob(f"{TMP_DIR}/**/*")]
    return [path for path in found if path.is_file()]


def remove_tmp_files(folder: Path, keep: Callable[[Path], bool] = lambda p: False) -> list[Path]:
    """Delete temporary files left by killed writers under ``folder`` (call it while holding the folder's
    lock)."""
    removed = []
    for path in tmp_files(folder):
        if not keep(path):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def portable(text: str) -> str:
    """A message or path without this machine's absolute paths: the project as ./, the home as ~."""
    import re

    for root, short in ((str(Path(__file__).resolve().parents[3]), "."), (str(Path.home()), "~")):
        if root not in ("", os.sep):
            text = re.sub(re.escape(root) + r"(?![\w.-])", short, text)
    return text


def portable_json(obj: Any) -> Any:
    """``portable`` applied to every string of a JSON-like object."""
    if isinstance(obj, str):
        return portable(obj)
    if isinstance(obj, Mapping):
        return {k: portable_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [portable_json(v) for v in obj]
    return obj


def json_safe(obj: Any) -> Any:
    """NaN/inf are not JSON: store them as null (a metric that is not a number is missing)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Mapping):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def sealed(obj: Mapping[str, Any]) -> dict:
    """``obj`` as it will read back from JSON, with its content digest (``record.content_digest``)."""
    safe = json_safe(obj)
    return {**safe, DIGEST: content_digest(safe)}


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    text = json.dumps(json_safe(obj), indent=2, sort_keys=True, allow_nan=False)
    return atomic_write(path, lambda f: f.write(text), mode="w")


def read_json(path: str | os.PathLike) -> Any:
    """Read a JSON file; a damaged one raises CorruptRecordError naming it."""
    path = Path(path)
    try:
        with open(path) as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CorruptRecordError(
            f"results file {path} is corrupted ({type(e).__name__}: {e}); fix or remove it by hand "
            "(nothing was deleted) and rerun to regenerate it"
        ) from e


def probe_writable(folder: str | os.PathLike) -> None:
    """Create ``folder`` and write then remove a temporary file in it: OSError when it cannot be written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    fd, probe = tempfile.mkstemp(dir=folder, prefix=".probe.", suffix=".tmp")
    os.close(fd)
    os.unlink(probe)


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes, kept while its stat (inode, size, mtime, ctime) is unchanged."""
    st = path.stat()
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _FILE_DIGESTS:
        if len(_FILE_DIGESTS) >= _FILE_DIGESTS_KEPT:
            _FILE_DIGESTS.clear()
        with open(path, "rb") as f:
            _FILE_DIGESTS[key] = hashlib.file_digest(f, "sha256").hexdigest()
    return _FILE_DIGESTS[key]
