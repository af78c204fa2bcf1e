"""What a finished run's record and side files must hold, checked whenever they are read.

A run id hashes the run's identity, and the identity says what the run made: one video per (prompt, seed),
each requested metric per video (a value, or the reason it is missing), and the run's labels
(``identity_labels``: derived when read, never taken from the file). The record lists every file of its run
(``files``: per-video results, probe tables, ``attention.csv`` with its rows, videos) with its bytes and
sha256, and carries the sha256 of its own canonical content (``digest``); its run-level means must be the
means of its videos' values, its probe summaries those of ``attention.csv``. A per-video result carries its own
digest and its side files' (what a resumed run trusts, before any record exists). A record or file that does
not hold that (edited, same size or not, truncated, half restored, or written before digests) is a damaged
run: named in one line ``damaged run <id> (<file>): <what>``, counted as unfinished (the runner regenerates
it) and never read into a table.

Cost: a process hashes each file once (kept by its stat). load_results over 40 Table-1-sized runs (7,760 files,
605 MB: 48 videos each with probe tables) takes 0.62 s of CPU on a process's first read (0.07 s without the
digests) and 0.13 s on later reads (scripts/store_check_cost.py --runs 40).
"""
from __future__ import annotations

import hashlib
import io
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pandas is imported where a table is read: `import jensenkv.run.cli` stays light
    import pandas as pd

from jensenkv.hashing import config_hash
from jensenkv.store.files import file_sha256
from jensenkv.store.record import ATTENTION_FILE, DIGEST, RECORD_SCHEMA, DamagedRunError, SealedRecord, content_digest

LABEL_FIELDS = ("model", "quantizer", "method", "bits", "correction")  # what the tables select runs by
INTEGER_LABELS = {"bits": False, "group_size": True, "sink_chunks": True, "window_chunks": True}  # -> nullable
METRIC_KEYS = {"attention": "delta_p_s_mean", "teacher_forced": "tf_rel_err"}  # a metric's key, where not its name
PROBE_VIDEO = ("prompt_index", "seed")  # the video of a probe row (prompt_index: the video's index in per_prompt)
PROBE_COLUMNS = (*PROBE_VIDEO, "layer", "step", "chunk", "branch", "p_s", "p_s_ref", "delta_p_s")
LEGACY_TEXT_COLUMNS = ["branch"]  # a table its record lists without text columns (a hand-made store's)
SHOWN = 3  # how many missing videos a message names
CHANGED = "its sha256 is not the one its record lists (same size): changed since the run wrote it"

NUMBER_TYPES = (int, float, type(None))  # a stored metric (null: not a number); a bool or a string is not one
NOT_MEANS = ("vbench",)  # run-level values that are not the mean of the videos' (VBench scores the run's videos)


def identity_labels(identity: Mapping[str, Any]) -> dict | None:
    """The results-table labels of a run, from its identity alone: what the runner writes (``RunSpec.labels``)
    and what a read checks and uses. None for an identity that is not a run's (no key, or a model of no
    registered family: a hand-made record), whose labels only its content digest covers."""
    from types import SimpleNamespace

    from jensenkv.calibration import strength_label
    from jensenkv.generation import GenerationConfig
    from jensenkv.models.registry import FAMILIES
    from jensenkv.quant.config import QuantConfig

    model, key = identity.get("model"), identity.get("key")
    own = FAMILIES.get(model.get("kind")) if isinstance(model, dict) else None
    if own is None or not isinstance(key, dict):
        return None
    key = QuantConfig(**key)
    quantized = key.method != "none"
    return {
        "model": own.model_label(SimpleNamespace(**model), GenerationConfig(**identity.get("generation", {}))),
        "quantizer": key.label,
        "method": key.method,
        "bits": int(key.bits) if quantized else 16,
        "group_size": int(key.group_size) if quantized else None,
        "granularity": key.granularity if quantized else None,
        "rotation": key.rotation if quantized else "none",
        "values": "none" if (identity.get("value") or {}).get("method") == "none" else "same",
        "correction": identity.get("correction"),
        "strength": strength_label(identity.get("strength"), identity.get("calibration")),
        "second_order": identity.get("second_order"),
        "calibration": identity.get("calibration"),
        "sink_chunks": identity.get("sink_chunks"),
        "window_chunks": identity.get("window_chunks"),
    }


def check_record(run_id: str, record: Any, path: str | Path) -> SealedRecord:
    """``record`` (read from ``path``) when it holds what run ``run_id`` must; else DamagedRunError."""
    def damaged(what: str) -> DamagedRunError:
        return DamagedRunError(run_id, path, what)

    if not isinstance(record, dict) or "run_id" not in record:
        raise damaged("not a run record (no run_id)")
    if record["run_id"] != run_id:
        raise damaged(f"run_id = {record['run_id']!r}, not its folder's {run_id!r}")
    identity = record.get("identity")
    if not isinstance(identity, dict):
        raise damaged("no identity" if identity is None else f"identity = {identity!r} is not a mapping")
    if config_hash(identity) != run_id:
        raise damaged(f"identity hashes to {config_hash(identity)}, not to its run id: it was changed")
    if record.get("schema") != RECORD_SCHEMA:
        raise damaged(f"record schema {record.get('schema')!r}, not {RECORD_SCHEMA}: written before records carried "
                      "content digests, so its values cannot be verified")
    labels = _check_labels(record.get("labels"), identity, damaged)
    _check_values(record, "", damaged)
    videos = record.get("per_prompt")
    if not isinstance(videos, list):
        raise damaged("no per_prompt (the per-video results)" if videos is None
                      else f"per_prompt = {type(videos).__name__}, not a list of videos")
    for i, video in enumerate(videos):
        if not isinstance(video, dict) or not isinstance(video.get("prompt"), str) or \
                not isinstance(video.get("seed"), int) or isinstance(video.get("seed"), bool):
            raise damaged(f"per_prompt[{i}] is not a video result (a prompt and an integer seed)")
        _check_values(video, f"per_prompt[{i}].", damaged)
    _check_videos(identity, videos, damaged)
    _check_requested(record, identity, videos, damaged)
    _check_means(record, videos, damaged)
    files = record.get("files", {})
    if not isinstance(files, dict) or not all(isinstance(v, dict) and isinstance(v.get("sha256"), str)
                                              for v in files.values()):
        raise damaged("files is not a mapping of the run's files to their sha256")
    if record.get(DIGEST) != content_digest(record):
        raise damaged("its content digest does not match its values: a value was edited after the run wrote it")
    return {**record, "labels": labels}


def _check_labels(labels: Any, identity: dict, damaged: Callable[[str], DamagedRunError]) -> dict:
    """The labels the identity gives (the file's must be those); the file's when the identity gives none."""
    if not isinstance(labels, dict):
        raise damaged("no labels" if labels is None else f"labels = {labels!r} is not a mapping")
    lacking = [k for k in LABEL_FIELDS if k not in labels]
    if lacking:
        raise damaged(f"labels lack {', '.join(lacking)}")
    for key, nullable in INTEGER_LABELS.items():
        value = labels.get(key)
        if key in labels and not (value is None and nullable) and (not isinstance(value, int) or
                                                                   isinstance(value, bool)):
            raise damaged(f"labels.{key} = {value!r} is not an integer")
    derived = identity_labels(identity)
    if derived is None:
        return labels
    wrong = next((k for k in (*LABEL_FIELDS, *sorted(set(derived) | set(labels)))
                  if labels.get(k, "(absent)") != derived.get(k, "(absent)")), None)
    if wrong is not None:
        raise damaged(f"labels.{wrong} = {labels.get(wrong, '(absent)')!r}, but its identity gives "
                      f"{derived.get(wrong, '(absent)')!r}: labels come from the identity")
    return derived


def _check_means(record: dict, videos: list[dict], damaged: Callable[[str], DamagedRunError]) -> None:
    """Each run-level value that is its videos' mean (as Runner.assemble takes it) is that mean, and a metric a
    video lacks for a reason has no run-level value. The probe summaries come from attention.csv
    (``check_probe_summary``), VBench's from the videos themselves."""
    from jensenkv.eval.attention import summary_keys

    values: dict[str, list] = {}
    lacking: set[str] = set()
    for video in videos:
        for k, v in video["metrics"].items():
            values.setdefault(k, []).append(v)
        lacking.update(video.get("missing", {}))
    run, probes = record["metrics"], summary_keys()
    for k, held in values.items():
        if k in probes or k.startswith(NOT_MEANS) or None in held:
            continue
        if k in lacking:
            if k in run:
                raise damaged(f"metrics.{k} = {run[k]!r}, but a video has no {k} value (its missing gives a "
                              "reason), so the run has none")
            continue
        if k not in run and k in record.get("missing", {}):
            continue
        _check_value(f"metrics.{k}", run.get(k), sum(held) / len(held), f"the mean of its {len(held)} videos",
                     damaged)
    sizes = [(v.get("cache_bytes"), v.get("cache_bf16_bytes")) for v in videos]
    sizes = [(a, b) for a, b in sizes if a and b]
    if sizes and "cache_bytes" in run:
        _check_value("metrics.cache_bytes", run["cache_bytes"], sum(a for a, _ in sizes) / len(sizes),
                     "its videos' mean", damaged)
        _check_value("metrics.effective_bits", run.get("effective_bits"),
                     16.0 * sum(a for a, _ in sizes) / sum(b for _, b in sizes), "what its videos' cache sizes give",
                     damaged)


def _check_value(name: str, held: Any, wanted: float, what: str, damaged: Callable[[str], DamagedRunError]) -> None:
    """``held`` is ``wanted`` up to a float round trip."""
    if held is None or not math.isclose(held, wanted, rel_tol=1e-9, abs_tol=1e-12):
        raise damaged(f"{name} = {held!r}, but {what} is {float(wanted)!r}: a value was edited")


def _check_values(holder: dict, where: str, damaged: Callable[[str], DamagedRunError]) -> None:
    """``metrics``: numbers (null: not a number); ``missing``: a reason per metric."""
    metrics, missing = holder.get("metrics"), holder.get("missing", {})
    if not isinstance(metrics, dict):
        raise damaged(f"no {where}metrics" if metrics is None else f"{where}metrics is not a mapping")
    bad = next((k for k, v in metrics.items() if type(v) not in NUMBER_TYPES), None)  # exact types: fast
    if bad is not None:
        raise damaged(f"{where}metrics.{bad} = {metrics[bad]!r} is not a number")
    if not isinstance(missing, dict):
        raise damaged(f"{where}missing is not a mapping")
    bad = next((k for k, v in missing.items() if type(v) is not str), None)
    if bad is not None:
        raise damaged(f"{where}missing.{bad} = {missing[bad]!r} is not a reason")


def _check_videos(identity: dict, videos: list[dict], damaged: Callable[[str], DamagedRunError]) -> None:
    """One video per (prompt, seed) of the identity, no more."""
    prompts, seeds = identity.get("prompts"), identity.get("seeds")
    if not isinstance(prompts, list) or not isinstance(seeds, list):
        return  # an identity that does not list them: nothing to count against
    wanted = Counter((p, s) for p in prompts for s in seeds)
    held = Counter((v["prompt"], v["seed"]) for v in videos)
    lost, extra = wanted - held, held - wanted
    if lost:
        names = ", ".join(f"{p!r} seed {s}" for p, s in list(lost)[:SHOWN]) + (", ..." if len(lost) > SHOWN else "")
        raise damaged(f"per_prompt holds {sum(held.values())} of the {sum(wanted.values())} videos its run id "
                      f"asks for; missing {names}")
    if extra:
        p, s = next(iter(extra))
        raise damaged(f"per_prompt holds a video its run id does not ask for: {p!r} seed {s}")


def has_metric(metric: str, *holders: Mapping[str, Any]) -> bool:
    """Whether any of the mappings has a key of ``metric``: its name, its key, or one of its parts
    (``<metric>_*``: VBench's dimensions, teacher-forced PSNR)."""
    key = METRIC_KEYS.get(metric, metric)
    if any(metric in h or key in h for h in holders):
        return True
    parts = (metric + "_", key.split("_")[0] + "_")
    return any(k.startswith(parts) for h in holders for k in h)


def _check_requested(record: dict, identity: dict, videos: list[dict],
                     damaged: Callable[[str], DamagedRunError]) -> None:
    """Every metric the identity asks for: a value or a reason, for the run and for each video."""
    requested = identity.get("metrics")
    if not isinstance(requested, list):
        return
    reasons = record.get("missing", {})
    for metric in requested:
        if not has_metric(metric, record["metrics"], reasons):
            raise damaged(f"metrics has no {metric} value and missing no reason for it")
        for i, video in enumerate(videos):
            if not has_metric(metric, video["metrics"], video.get("missing", {}), reasons):
                raise damaged(f"per_prompt[{i}] ({video['prompt']!r} seed {video['seed']}) has no {metric} value "
                              "and no reason it is missing")


# --- attention.csv -----------------------------------------------------------------------------------
def check_side_files(run_id: str, run_dir: Path, record: dict) -> None:
    """Every file the record lists is there with its bytes and sha256 (hashed once per process while its stat
    holds); a changed attention.csv is read to say what is wrong, when that can be said."""
    for name, listed in record.get("files", {}).items():
        path = run_dir / name
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            rows = f" with {listed['rows']} rows" if "rows" in listed else ""
            raise DamagedRunError(run_id, path, f"missing: the record lists it{rows}") from None
        if size != listed.get("bytes"):
            if name == ATTENTION_FILE:
                read_attention(run_id, run_dir, record)  # names what is wrong, when it can be said
            raise DamagedRunError(run_id, path, f"{size} bytes, the record says {listed.get('bytes')}: changed "
                                                "since the run wrote it")
        if file_sha256(path) != listed["sha256"]:
            if name == ATTENTION_FILE:
                read_attention(run_id, run_dir, record)
            raise DamagedRunError(run_id, path, CHANGED)


def check_video_result(run_id: str, path: Path, result: Any, run_dir: Path) -> None:
    """A per-video result (``prompts/<index>.json``) holds its own content digest and its side files' sha256
    (probe table, videos), all still matching: what a resumed run may trust before any record exists."""
    if not isinstance(result, dict) or not isinstance(result.get(DIGEST), str):
        raise DamagedRunError(run_id, path, "no content digest (written before per-video results carried one): "
                                            "its values cannot be verified")
    if result[DIGEST] != content_digest(result):
        raise DamagedRunError(run_id, path, "its content digest does not match its values: a value was edited "
                                            "after the run wrote it")
    for name, digest in (result.get("files") or {}).items():
        side = run_dir / name
        if not side.is_file() or file_sha256(side) != digest:
            raise DamagedRunError(run_id, side, f"missing or changed since the run wrote it (its video's result "
                                                f"{path.name} lists its sha256)")


def text_columns(frame: pd.DataFrame) -> list[str]:
    """The columns of a table about to be written that hold labels, not numbers (a probe's ``branch``, a
    family's own labels such as WorldPlay's ``stream``): what the writer writes, so the check needs no list."""
    import pandas as pd

    return [str(c) for c in frame.columns if not pd.api.types.is_numeric_dtype(frame[c])]


def side_file_entry(path: Path, frame: pd.DataFrame) -> dict:
    """The record's ``files`` entry of a table ``frame`` just written to ``path``: its rows, its bytes and its
    text columns (every other column must read back as numbers)."""
    return {"rows": len(frame), "bytes": path.stat().st_size, "text_columns": text_columns(frame)}


def read_attention(run_id: str, run_dir: Path, record: dict) -> pd.DataFrame | None:
    """The run's probe table (``attention.csv``), checked whole: a text table with the probe columns and
    numbers where numbers belong; when the record lists it, its rows and the same probes for every probed
    video. None when the run has no such file; DamagedRunError naming the file and what is wrong otherwise."""
    path = run_dir / ATTENTION_FILE
    listed = record.get("files", {}).get(ATTENTION_FILE)

    def damaged(what: str) -> DamagedRunError:
        return DamagedRunError(run_id, path, what)

    try:
        data = path.read_bytes()
    except FileNotFoundError:
        if listed is None:
            return None
        raise damaged(f"missing: the record lists it with {listed.get('rows')} rows") from None
    text = listed.get("text_columns", LEGACY_TEXT_COLUMNS) if listed is not None else LEGACY_TEXT_COLUMNS
    if not isinstance(text, (list, tuple)) or not all(isinstance(c, str) for c in text):
        raise DamagedRunError(run_id, run_dir / "record.json", f"files.{ATTENTION_FILE}.text_columns = {text!r} is "
                              "not a list of column names")
    frame = _probe_table(data, damaged, text)
    if listed is not None and "rows" in listed:  # a table its writer listed (a hand-made store's: only its digest)
        _check_probe_rows(frame, record, listed, damaged)
        if len(data) != listed.get("bytes"):
            raise damaged(f"{len(data)} bytes, the record says {listed.get('bytes')}: changed since the run wrote it")
        if hashlib.sha256(data).hexdigest() != listed.get("sha256"):
            raise damaged(CHANGED)
        _check_probe_summary(frame, record, lambda what: DamagedRunError(run_id, run_dir / "record.json", what))
    return frame


def _check_probe_summary(frame: pd.DataFrame, record: dict, damaged: Callable[[str], DamagedRunError]) -> None:
    """The run-level probe summaries (means and medians over every probe) are those of its attention.csv."""
    from jensenkv.eval.attention import summarize_probes

    for key, value in summarize_probes(frame).items():
        if key in record["metrics"] and math.isfinite(value):
            _check_value(f"metrics.{key}", record["metrics"][key], value, f"its {ATTENTION_FILE} gives", damaged)


def _probe_table(data: bytes, damaged: Callable[[str], DamagedRunError], text: Sequence[str]) -> pd.DataFrame:
    """The bytes of a probe table as a DataFrame: text, CSV, the probe columns, rows, numbers in every column
    but the ``text`` ones."""
    import pandas as pd

    if not data or data.isspace():
        raise damaged("empty: no header and no rows")
    try:
        frame = pd.read_csv(io.BytesIO(data), encoding="utf-8")
    except (pd.errors.ParserError, ValueError) as e:  # UnicodeDecodeError is a ValueError
        if isinstance(e, UnicodeDecodeError) or b"\0" in data or not _utf8(data):
            raise damaged("not text: binary data where a CSV table belongs") from None
        raise damaged(f"not a CSV table ({type(e).__name__}: {str(e).strip().splitlines()[0]})") from None
    lacking = [c for c in PROBE_COLUMNS if c not in frame.columns]
    if lacking:
        header = data[:min(data.find(b"\n") % (len(data) + 1), 60)].decode("utf-8", "replace")
        raise damaged(f"its header lacks the columns {', '.join(lacking)} (header: {header!r})")
    if frame.empty:
        raise damaged("header only, no rows")
    if not data.endswith(b"\n"):
        raise damaged(f"truncated: its last row (line {len(frame) + 1}) is cut off")
    for column in frame.columns:
        if column in text or pd.api.types.is_numeric_dtype(frame[column]):
            continue
        values = frame[column]
        text_rows = values[pd.to_numeric(values, errors="coerce").isna() & values.notna()]
        if len(text_rows):
            raise damaged(f"column {column} holds text where numbers belong ({text_rows.iloc[0]!r} on line "
                          f"{int(text_rows.index[0]) + 2})")
    return frame


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _check_probe_rows(frame: pd.DataFrame, record: dict, listed: dict,
                      damaged: Callable[[str], DamagedRunError]) -> None:
    """The rows the record lists, and the same number of probes for every probed video."""
    probed = {(v.get("index"), v["seed"]) for v in record["per_prompt"] if has_metric("attention", v["metrics"])}
    held = {tuple(int(x) for x in key) for key in frame[list(PROBE_VIDEO)].drop_duplicates().itertuples(index=False)}
    lost = sorted(probed - held)
    if lost:
        raise damaged(f"no probe rows for video(s) {', '.join(f'{i} (seed {s})' for i, s in lost[:SHOWN])} of the "
                      f"{len(probed)} the record has probes for")
    per_video = frame.groupby(list(PROBE_VIDEO)).size()
    if per_video.nunique() > 1:
        (index, seed), rows = per_video.idxmin(), int(per_video.min())
        raise damaged(f"video {index} (seed {seed}) has {rows} probe rows, the others {int(per_video.max())}")
    if len(frame) != listed.get("rows"):
        raise damaged(f"{len(frame)} rows, the record says {listed.get('rows')}")
