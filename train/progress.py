"""How a training run reports itself: its steps through ``retr.retrieval.progress`` (on a terminal a step bar with
its ETA and the running loss; elsewhere a line every ``RETR_PROGRESS_SECONDS``), and one log line per epoch with
the dev metric of its evaluation.

Imported only once a trainer runs (it imports transformers): ``run_trainer`` attaches it in place of transformers'
own printer, which writes raw ``{'loss': ...}`` dicts to stdout.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from retr.retrieval.progress import Progress, clock

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProgressConfig:
    """What to report: ``metric_key`` is the evaluation's metric (as the trainer logs it), shown as ``label``;
    ``bar`` draws the step bar (default: when stderr is a terminal and retr logs at INFO; otherwise the steps are
    logged at ``retr.retrieval.progress``'s interval)."""
    metric_key: str = "eval_dev_ndcg@10"
    label: str = "dev nDCG@10"
    bar: bool | None = None


class TrainProgress(TrainerCallback):
    """A transformers TrainerCallback: the step bar (tqdm, on stderr) with the last logged loss, and per evaluation
    one line: epoch, the epoch's mean training loss, the dev metric, steps done, time spent and left."""

    def __init__(self, cfg: ProgressConfig = ProgressConfig()):
        self.cfg = cfg
        self.bar = None
        self._redirect = None
        self._t0: float | None = None
        self._first_step = 0
        self._last_logged = 0
        self._loss_sum = 0.0
        self._loss_steps = 0
        self._postfix: dict[str, str] = {}  # what the bar shows after its counts: the last loss, the last dev metric

    # transformers' events ------------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        self._t0 = time.perf_counter()
        self._first_step = self._last_logged = state.global_step  # > 0 when resumed
        self.bar = Progress(state.max_steps, "training", unit="step", bar=self.cfg.bar, initial=state.global_step,
                            leave=True)
        if self.bar.drawing:
            from tqdm.contrib.logging import logging_redirect_tqdm

            # retr's log lines go above the bar instead of through it
            self._redirect = logging_redirect_tqdm(loggers=[logging.getLogger("retr")])
            self._redirect.__enter__()

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.done)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs:
            return
        steps = state.global_step - self._last_logged  # the logged loss is the mean over these steps
        self._last_logged = state.global_step
        self._loss_sum += float(logs["loss"]) * steps
        self._loss_steps += steps
        self._postfix["loss"] = f"{float(logs['loss']):.4f}"
        if self.bar is not None:
            self.bar.set_postfix(**self._postfix)

    def on_epoch_end(self, args, state, control, **kwargs):
        control.should_log = True  # the epoch's last steps' loss is logged before its evaluation, not after
        return control

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        value = (metrics or {}).get(self.cfg.metric_key)
        shown = "n/a" if value is None else f"{value:.4f}"
        if self._t0 is None:  # an evaluation before training
            logger.info("before training: %s %s", self.cfg.label, shown)
            return
        parts = [f"epoch {self._epoch(state)}"]
        if self._loss_steps:
            parts.append(f"loss {self._loss_sum / self._loss_steps:.4f}")
        parts.append(f"{self.cfg.label} {shown}")
        done = state.global_step - self._first_step
        spent = time.perf_counter() - self._t0
        left = spent / done * (state.max_steps - state.global_step) if done else 0.0
        logger.info("%s (step %d/%d, %s, %s left)", ", ".join(parts), state.global_step, state.max_steps,
                    clock(spent), clock(left))
        self._loss_sum, self._loss_steps = 0.0, 0
        self._postfix[self.cfg.label] = shown
        if self.bar is not None:
            self.bar.set_postfix(**self._postfix)

    def on_train_end(self, args, state, control, **kwargs):
        self.close()

    # -----------------------------------------------------------------------------------------------------------
    @staticmethod
    def _epoch(state) -> str:
        total = getattr(state, "num_train_epochs", None)
        epoch = state.epoch or 0.0
        shown = str(round(epoch)) if math.isclose(epoch, round(epoch), abs_tol=1e-6) else f"{epoch:.2f}"
        return f"{shown}/{total}" if total else shown

    def close(self) -> None:
        """Close the bar and stop redirecting retr's log lines (also when training raised)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self._redirect is not None:
            self._redirect.__exit__(None, None, None)
            self._redirect = None


def attach(trainer, cfg: ProgressConfig) -> TrainProgress:
    """Replace ``trainer``'s own printer (raw dicts on stdout) or tqdm bar with a ``TrainProgress``."""
    for own in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(own)
    progress = TrainProgress(cfg)
    trainer.add_callback(progress)
    return progress
