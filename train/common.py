"""What the trainers share: the dev evaluator, checkpoint handling, the output folder and its manifest."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path

from retr.eval.metrics import evaluate
from retr.indexes.atomic import atomic_dir
from retr.indexes.manifest import new_manifest
from retr.retrieval.types import Hit, Qrels, Run

logger = logging.getLogger(__name__)


def checkpoint_dir(out: Path) -> Path:
    return out.parent / f".{out.name}.checkpoints"


def last_checkpoint(out: Path) -> str | None:
    ckpts = sorted(checkpoint_dir(out).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
    return str(ckpts[-1]) if ckpts else None


def dev_ndcg(scores: Mapping[str, Mapping[str, float]], qrels: Qrels) -> float:
    """nDCG@10 of each dev query's candidates ranked by ``scores[qid][doc]``."""
    return evaluate(Run({q: [Hit(d, float(s)) for d, s in docs.items()] for q, docs in scores.items()}),
                    qrels, [10]).mean["NDCG@10"]


def write_output(out: Path, save_model: Callable[[Path], None], kind: str, config, extra: dict) -> dict:
    """Save the model and its manifest into ``out`` atomically; then drop the checkpoints."""
    with atomic_dir(out) as tmp:
        save_model(tmp)
        manifest = new_manifest(kind, config=asdict(config), **extra)
        (tmp / "retr_manifest.json").write_text(json.dumps(manifest, indent=2, default=str) + "\n")
    shutil.rmtree(checkpoint_dir(out), ignore_errors=True)
    logger.info("%s written to %s", kind, out)
    return manifest
