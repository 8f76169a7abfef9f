"""What the trainers share: the labeled data and its dev split, the dev evaluator, the trainer's run, checkpoint
handling, the output folder and its manifest."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from retr.eval.metrics import evaluate
from retr.retrieval.artifacts import atomic_dir, new_manifest, write_json
from retr.retrieval.backends.platform import this_platform
from retr.retrieval.errors import RetrError
from retr.retrieval.models import DEFAULT_MODEL, model_architecture
from retr.retrieval.types import Hit, Qrels, Run, check_float
from retr.train.data import Pair, labeled_pairs, split_dev

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainConfig:
    """What every trainer takes; each trainer's config adds its own fields and may change these defaults."""
    base: str | None = None  # BERT or sentence-transformers folder (default: the bundled MiniLM)
    epochs: int = 1
    batch_size: int = 16
    learning_rate: float = 5e-5
    warmup_ratio: float = 0.1  # of the total steps, linear warm-up
    max_length: int = 256
    seed: int = 42
    max_steps: int = -1
    # the embeddings and the first N transformer layers take no gradient: no backward pass through them
    freeze_layers: int = 0
    # dropout while training, on the attention probabilities and on every other layer of the backbone (not a
    # classifier head's); None keeps the base's own config. See ``dropout_overrides``
    attention_dropout: float | None = None
    hidden_dropout: float | None = None

    def __post_init__(self) -> None:
        check_float(self.learning_rate, "--lr", 0.0, 1.0, open_low=True)
        check_float(self.warmup_ratio, "warmup ratio", 0.0, 1.0)
        for name in ("attention_dropout", "hidden_dropout"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value < 1.0:
                raise RetrError(f"--{name.replace('_', '-')} must be in [0, 1), got {value}")

    @property
    def base_name(self) -> str:
        return self.base or DEFAULT_MODEL


def common_training_args(out: Path, cfg: TrainConfig, n_examples: int, log_every: int = 10) -> dict:
    """The TrainingArguments every trainer shares (transformers' or sentence-transformers'): one checkpoint per
    epoch, warm-up as a ratio of the steps (``warmup_steps`` takes a float below 1 as a ratio)."""
    return dict(
        output_dir=str(checkpoint_dir(out)), num_train_epochs=cfg.epochs, max_steps=cfg.max_steps,
        per_device_train_batch_size=cfg.batch_size, learning_rate=cfg.learning_rate, warmup_steps=cfg.warmup_ratio,
        seed=cfg.seed, eval_strategy="epoch", save_strategy="epoch", save_total_limit=2, load_best_model_at_end=True,
        logging_strategy="steps", logging_steps=max(1, min(log_every, n_examples // cfg.batch_size // 2)),
        report_to="none", use_cpu=True,
        # no tqdm bar and no raw dicts of transformers' own: retr.train.progress reports (run_trainer attaches it)
        disable_tqdm=True, log_level="passive",
    )


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
        architecture = model_architecture(tmp)
        manifest = new_manifest(kind, config=asdict(config), architecture=architecture, **extra)
        write_json(tmp / "retr_manifest.json", manifest)
    shutil.rmtree(checkpoint_dir(out), ignore_errors=True)
    logger.info("%s written to %s", kind, out)
    return manifest


def _backbone(model):
    """The one BERT-like backbone inside ``model``: its token embeddings, the module holding its transformer layers
    and that module's attribute for them."""
    for m in model.modules():
        if not hasattr(m, "embeddings"):
            continue
        encoder = getattr(m, "encoder", None)
        if getattr(encoder, "layer", None) is not None:  # BERT
            return m.embeddings, encoder, "layer"
        if getattr(m, "layers", None) is not None:  # ModernBERT
            return m.embeddings, m, "layers"
    raise RetrError(f"no transformer layers found in {type(model).__name__}")


def _backbone_layers(model):
    """The token embeddings and the list of transformer layers of the one BERT-like backbone inside ``model``."""
    embeddings, holder, attr = _backbone(model)
    return embeddings, list(getattr(holder, attr))


def keep_bottom(model, n: int) -> dict:
    """Keep only the first ``n`` transformer layers of the one backbone inside ``model`` (its config says so, so the
    saved model loads with ``n``): a smaller, faster model that starts from the bottom of a trained one. ``n`` = 0
    keeps them all. Returns what was kept, for the manifest."""
    import torch

    _, holder, attr = _backbone(model)
    layers = list(getattr(holder, attr))
    if n <= 0 or n == len(layers):
        return {"layers": len(layers)}
    if n > len(layers):
        raise RetrError(f"--layers {n}: the model has only {len(layers)} layers")
    setattr(holder, attr, torch.nn.ModuleList(layers[:n]))
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and getattr(cfg, "num_hidden_layers", None) == len(layers):
            cfg.num_hidden_layers = n
            if isinstance(getattr(cfg, "layer_types", None), list):  # per-layer attention kinds (ModernBERT)
                cfg.layer_types = cfg.layer_types[:n]
    logger.info("the first %d of %d transformer layers kept", n, len(layers))
    return {"layers": n, "layers_of_base": len(layers)}


def freeze_bottom(model, n: int) -> dict:
    """Freeze the embeddings and the first ``n`` transformer layers of ``model`` (a torch module holding one
    backbone): autograd then stops at layer ``n``, so a step skips their backward pass (about two thirds of each
    frozen layer's cost). ``n`` = 0 changes nothing. Returns what was frozen, for the manifest."""
    if n <= 0:
        return {"frozen_layers": 0}
    embeddings, layers = _backbone_layers(model)
    if n >= len(layers):
        raise RetrError(f"--freeze-layers {n}: the model has {len(layers)} layers; leave at least one to train")
    for module in (embeddings, *layers[:n]):
        for param in module.parameters():
            param.requires_grad_(False)
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    logger.info("embeddings and layers 1-%d of %d frozen: %d of %d parameters train", n, len(layers), trainable, total)
    return {"frozen_layers": n, "trainable_parameters": trainable, "parameters": total}


def resolve_precision(precision: str) -> str:
    """``auto`` -> bf16 where native, else fp32; ``bf16``/``fp32`` as asked."""
    if precision not in ("auto", "bf16", "fp32"):
        raise RetrError(f"unknown precision {precision!r}: choose auto, bf16 or fp32")
    if precision == "auto":
        return "bf16" if this_platform().bf16 else "fp32"
    return precision


def dropout_overrides(base: Path, cfg: TrainConfig) -> dict[str, float]:
    """The config entries that set ``cfg``'s dropout in the backbone at ``base`` (its config.json), to pass as
    ``config_kwargs`` when it is loaded. Names differ by architecture, so they are found by name: an entry with
    ``dropout`` and ``attention`` in it is attention dropout (BERT's ``attention_probs_dropout_prob``, ModernBERT's
    ``attention_dropout``); any other ``dropout`` entry but a classifier's is hidden dropout (BERT's
    ``hidden_dropout_prob``, ModernBERT's ``mlp_dropout`` and ``embedding_dropout``). Empty when both are None."""
    wanted = {"attention": cfg.attention_dropout, "hidden": cfg.hidden_dropout}
    if all(v is None for v in wanted.values()):
        return {}
    config = base / "config.json"
    try:
        entries = json.loads(config.read_text())
    except (OSError, ValueError) as e:
        raise RetrError(f"{config}: cannot read the backbone's config to set its dropout ({e})") from None
    out: dict[str, float] = {}
    for kind, value in wanted.items():
        if value is None:
            continue
        keys = [k for k, v in entries.items() if _dropout_kind(k, v) == kind]
        if not keys:
            raise RetrError(f"{config}: no {kind} dropout entry to set --{kind}-dropout with")
        out.update(dict.fromkeys(keys, value))
    return out


def transformer_kwargs(base: Path, cfg: TrainConfig, precision: str) -> dict:
    """What a trainer loads the transformer at ``base`` with, as sentence-transformers' ``model_kwargs`` and
    ``config_kwargs``: ``cfg``'s dropout (``dropout_overrides``) and the attention that ``precision`` and that
    dropout call for (``model_kwargs``)."""
    config_kwargs = dropout_overrides(base, cfg)
    return {"model_kwargs": model_kwargs(precision, base, config_kwargs), "config_kwargs": config_kwargs}


def model_kwargs(precision: str, base: Path, config_kwargs: dict[str, float]) -> dict | None:
    """What a trainer loads the transformer at ``base`` with for ``precision`` and the dropout overrides
    ``config_kwargs`` (``dropout_overrides``): under bf16, torch's SDPA where the attention probabilities are not
    dropped out (its fused kernel: 1.2-1.3x faster a step than eager on an AMX CPU, 1.44x for a whole bi-encoder
    epoch), eager where they are (SDPA then leaves its fused kernel: ~20% slower than eager on an AVX-512 EPYC, a
    tie on AMX; ``benchmarks/train_step.py``). fp32 keeps transformers' default."""
    if precision != "bf16":
        return None
    return {"attn_implementation": "eager"} if _attention_dropout(base, config_kwargs) > 0 else None


def _attention_dropout(base: Path, config_kwargs: dict[str, float]) -> float:
    """The attention dropout the model at ``base`` trains with: ``config_kwargs``'s, else its config.json's
    (the largest attention dropout entry; 0.1, BERT's, where the config cannot be read or names none)."""
    entries = dict(config_kwargs)
    if not any(_dropout_kind(k, v) == "attention" for k, v in entries.items()):
        try:
            entries = json.loads((base / "config.json").read_text())
        except (OSError, ValueError):
            return 0.1
    values = [v for k, v in entries.items() if _dropout_kind(k, v) == "attention"]
    return max(values) if values else 0.1


def _dropout_kind(key: str, value) -> str | None:
    """``attention`` or ``hidden`` for a config entry that sets dropout (a classifier's aside), else None."""
    if "dropout" not in key or "classifier" in key or not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    return "attention" if "attention" in key else "hidden"


def dev_evaluator(score_all: Callable[[object], Mapping[str, Mapping[str, float]]], qrels: Qrels):
    """A sentence-transformers evaluator reporting ``dev_ndcg@10`` of ``score_all(model)``."""
    from sentence_transformers.sentence_transformer.evaluation import SentenceEvaluator

    class DevEvaluator(SentenceEvaluator):
        def __init__(self):
            super().__init__()
            self.primary_metric = "ndcg@10"
            self.history: list[tuple[float, Mapping[str, Mapping[str, float]]]] = []  # (value, scores) per call

        def best_scores(self) -> Mapping[str, Mapping[str, float]]:
            """The dev scores of the best evaluation (the checkpoint the trainer keeps)."""
            return max(self.history, key=lambda h: h[0])[1]

        def __call__(self, model, output_path=None, epoch=-1, steps=-1):
            scores = score_all(model)
            value = dev_ndcg(scores, qrels)
            self.history.append((value, scores))
            logger.debug("dev nDCG@10 %.4f (epoch %s)", value, epoch)  # the progress line reports it
            return self.prefix_name_to_metrics({"ndcg@10": value}, "dev")

    return DevEvaluator()


def run_trainer(trainer, out: Path, resume: bool, eval_key: str = "eval_dev_ndcg@10", name: str = "dev_ndcg@10",
                best: Callable = max, label: str = "dev nDCG@10", evaluate_first: bool = False) -> dict:
    """Train (from the last checkpoint with ``resume``), reporting progress (``retr.train.progress``: a step bar on a
    terminal, a line per epoch elsewhere, ``eval_key`` shown as ``label``); return what the manifest records of it:
    ``{name}_per_epoch`` (the trainer's ``eval_key`` at each evaluation), ``{name}`` (the ``best`` of them),
    the training loss history, the checkpoint resumed from and the step count; with ``evaluate_first``, also
    ``{name}_before``: the trainer's own evaluation before the first step."""
    from retr.train.progress import ProgressConfig, attach

    resume_from = last_checkpoint(out) if resume else None
    if resume and resume_from is None:
        logger.warning("--resume: no checkpoint under %s, starting from scratch", checkpoint_dir(out))
    progress = attach(trainer, ProgressConfig(metric_key=eval_key, label=label))
    try:
        before = {f"{name}_before": trainer.evaluate()[eval_key]} if evaluate_first else {}
        output = trainer.train(resume_from_checkpoint=resume_from)
    finally:
        progress.close()
    history = trainer.state.log_history
    dev = [h[eval_key] for h in history if eval_key in h]
    evals = [h[k] for h in history for k in h if k.endswith("_runtime") and k.startswith("eval")]
    return {**before, f"{name}_per_epoch": dev, name: best(dev) if dev else None,
            "loss_history": [h["loss"] for h in history if "loss" in h], "resumed_from": resume_from,
            "steps": trainer.state.global_step,
            # the trainer's own clock: steps and its evaluations; the steps alone without them
            "trainer_seconds": output.metrics.get("train_runtime"), "eval_seconds": sum(evals)}


@dataclass(frozen=True)
class DevSplit:
    """The training pairs of a labeled dataset and the dev queries carved from its training queries (fixed seed)."""
    pairs: list[Pair]
    queries: dict[str, str]
    qrels: Qrels


def dev_split(queries: Mapping[str, str], qrels: Qrels, fraction: float, seed: int, why: str = "") -> DevSplit:
    """The training pairs of ``queries`` judged in ``qrels`` and a dev split of them (``split_dev``): every labeled
    trainer's, alike for one seed. Too few of either is an error, ``why`` added to it."""
    train_q, dev_q = split_dev(qrels, fraction, seed)
    split = DevSplit(labeled_pairs(queries, qrels, train_q), {q: queries[q] for q in dev_q},
                     Qrels({q: qrels[q] for q in dev_q}))
    if not split.pairs or not split.queries:
        raise RetrError(f"too little training data: {len(split.pairs)} pairs, {len(split.queries)} dev queries{why}")
    return split


def bm25_negatives(corpus, texts: list[str], pairs: list[Pair], qrels: Qrels | None, dev: DevSplit, num_negatives: int,
                   cfg):
    """From one BM25 over ``corpus``: each pair's ``num_negatives`` hard negatives (``mine_bm25_negatives``)
    and each dev query's BM25 top ``cfg.dev_candidates`` plus its positives, the list dev nDCG@10 ranks."""
    from retr.train.negatives import mine_bm25_negatives, temporary_bm25

    with temporary_bm25(corpus.ids, texts) as bm25:
        negatives = (mine_bm25_negatives(pairs, bm25, qrels, num_negatives, cfg.seed, depth=cfg.negative_depth)
                     if num_negatives else [[] for _ in pairs])
        run = bm25.search(dev.queries, cfg.dev_candidates)
    candidates = {q: list(dict.fromkeys([h.doc_id for h in run[q]] + [d for d, g in dev.qrels[q].items() if g > 0]))
                  for q in dev.queries}
    return negatives, candidates


def pair_columns(pairs: list[Pair], negatives: list[list[str]], positive_text: dict[str, str],
                 doc_text: dict[str, str]) -> dict[str, list[str]]:
    """The trainer's columns: anchor, positive, negative_1..n."""
    columns = {"anchor": [p.query for p in pairs], "positive": [positive_text[p.positive_id] for p in pairs]}
    for j in range(len(negatives[0]) if negatives else 0):
        columns[f"negative_{j + 1}"] = [doc_text[n[j]] for n in negatives]
    return columns


def embedding_scorer(queries: dict[str, str], candidates: dict[str, list[str]], doc_text: dict[str, str],
                     precision: str, **encode_kwargs) -> Callable:
    """``score_all`` for an encoder: each dev query's candidates scored by the dot product of the model's query and
    document embeddings (``encode_query`` / ``encode_document`` with ``encode_kwargs``), under ``precision``."""

    def score_all(model):
        import torch

        qids = list(queries)
        docs = sorted({d for q in qids for d in candidates[q]})
        pos = {d: i for i, d in enumerate(docs)}
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):  # as the steps run
            q_emb = model.encode_query([queries[q] for q in qids], convert_to_tensor=True, show_progress_bar=False,
                                       **encode_kwargs).float()
            d_emb = model.encode_document([doc_text[d] for d in docs], convert_to_tensor=True, batch_size=32,
                                          show_progress_bar=False, **encode_kwargs).float()
        scores = (q_emb @ d_emb.T).numpy()
        return {q: {d: float(scores[i, pos[d]]) for d in candidates[q]} for i, q in enumerate(qids)}

    return score_all


def fit(trainer_cls, args_cls, out: Path, cfg, precision: str, n_examples: int, resume: bool, **trainer_args) -> dict:
    """Run (``run_trainer``) a sentence-transformers ``trainer_cls`` with ``trainer_args`` (model, train_dataset,
    loss, evaluator, callbacks) and the ``args_cls`` arguments every encoder trainer shares: one checkpoint per
    epoch, the best by dev nDCG@10, bf16 where ``precision`` says so."""
    from sentence_transformers.sentence_transformer.training_args import BatchSamplers

    args = args_cls(**common_training_args(out, cfg, n_examples), data_seed=cfg.seed, bf16=precision == "bf16",
                    batch_sampler=BatchSamplers.NO_DUPLICATES, metric_for_best_model="eval_dev_ndcg@10",
                    greater_is_better=True, dataloader_num_workers=0)
    return run_trainer(trainer_cls(args=args, **trainer_args), out, resume)


def labeled_inputs(dataset, cfg) -> tuple[dict[str, str], DevSplit, dict[str, list[str]], dict[str, list[str]]]:
    """What an encoder trainer over a labeled dataset reads: each document's text, the dev split, the trainer's
    columns (anchor, positive, ``cfg.num_negatives`` BM25 negatives) and each dev query's candidates."""
    doc_text = {d.doc_id: d.full_text() for d in dataset.corpus.docs}
    dev = dev_split(dataset.queries, dataset.qrels, cfg.dev_fraction, cfg.seed)
    negatives, candidates = bm25_negatives(dataset.corpus, list(doc_text.values()), dev.pairs, dataset.qrels, dev,
                                           cfg.num_negatives, cfg)
    return doc_text, dev, pair_columns(dev.pairs, negatives, doc_text, doc_text), candidates
