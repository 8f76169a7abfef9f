"""What a training run needs around it: the `retr[train]` extra installed, and the libraries' own progress bars
off while it runs (retr's trainers report progress themselves: ``retr.train.progress``).

Nothing here imports a training library at import time: the CLI imports the trainers' configs to build its parser.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from retr.retrieval.errors import RetrError

# the packages `pip install 'retr[train]'` adds (pyproject.toml) that training imports or the trainers require
TRAIN_EXTRA = ("datasets", "accelerate")
# sentence-transformers' model-card modules draw "Computing widget examples" with their own tqdm when a trainer is
# built: the first of these that imports (sentence-transformers 6's, else older releases')
MODEL_CARD_MODULES = ("sentence_transformers.base.model_card", "sentence_transformers.model_card")

F = TypeVar("F", bound=Callable)


def require_training_stack() -> None:
    """Raise a one-line RetrError naming the install command when the `train` extra's packages are missing."""
    missing = [name for name in TRAIN_EXTRA if importlib.util.find_spec(name) is None]
    if missing:
        are = "is" if len(missing) == 1 else "are"
        raise RetrError(f"training needs {' and '.join(missing)}, which {are} not installed: pip install 'retr[train]' "
                        "(from a source checkout: pip install -e '.[train]')")


@contextmanager
def quiet_libraries() -> Iterator[None]:
    """Within: transformers' and datasets' progress bars off, and sentence-transformers' model-card bar too; each
    restored as it was on the way out (a Python caller's own settings are left as found)."""
    restore: list[Callable[[], None]] = []
    from transformers.utils import logging as hf_logging

    if hf_logging.is_progress_bar_enabled():
        hf_logging.disable_progress_bar()
        restore.append(hf_logging.enable_progress_bar)
    try:
        import datasets
    except ImportError:  # pragma: no cover - require_training_stack refuses first
        datasets = None
    if datasets is not None and datasets.is_progress_bar_enabled():
        datasets.disable_progress_bars()
        restore.append(datasets.enable_progress_bars)
    for name in MODEL_CARD_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        bar = getattr(module, "tqdm", None)
        if bar is not None:
            module.tqdm = functools.partial(bar, disable=True)
            restore.append(functools.partial(setattr, module, "tqdm", bar))
        break
    try:
        yield
    finally:
        for undo in reversed(restore):
            undo()


def training_run(train: F) -> F:
    """Decorate a trainer's entry point ``train(out, cfg, ...)``: refuse clearly without the `train` extra, seed
    Python's and torch's generators with ``cfg.seed``, run with the libraries quiet."""

    @functools.wraps(train)
    def run(out, cfg, *args, **kwargs):
        require_training_stack()
        import random

        import torch

        random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        with quiet_libraries():
            return train(out, cfg, *args, **kwargs)

    return run  # type: ignore[return-value]
