"""`retr train mlm`: domain-adaptive masked-language modelling, each backbone with its own recipe.

Of the tokens chosen for prediction (``mask_prob`` of the non-special tokens, or of the words with
``whole_word``: then every word-piece of a chosen word), 80% become [MASK], 10% a random token and
10% stay as they are (BERT's rule; ``replace`` sets other shares, as the rows of BERT's ablation write them).
An input is a document, a sentence pair or a pair of contiguous segments (``packing``: train/packing.py); with
``nsp`` BERT's [CLS] next-sentence head trains beside MLM. How many are chosen follows the backbone's pre-training: 15% for BERT
(Devlin et al.), 30% for ModernBERT (Warner et al., 2024); ``RECIPES`` holds them, the output's manifest records
the one used. A checkpoint without an MLM head (the bundled MiniLM) gets one, its decoder
tied to the input embeddings. The checkpoint with the lowest dev MLM loss (held-out documents) is kept.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path

from retr.indexes.corpus import Corpus
from retr.retrieval.errors import RetrError
from retr.retrieval.models import ModelRef
from retr.retrieval.types import check_float
from retr.train.common import TrainConfig, common_training_args, dropout_overrides, run_trainer, write_output
from retr.train.packing import check_packing, pack
from retr.train.runtime import training_run

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MaskRecipe:
    mask_prob: float  # share of the (non-special) tokens chosen for prediction
    mask: float = 0.8  # of those: replaced by [MASK]
    random: float = 0.1  # replaced by a random token (the rest stay as they are)

    @property
    def keep(self) -> float:
        return round(1.0 - self.mask - self.random, 10)

    def to_dict(self, architecture: str) -> dict:
        """What the manifest records; ``replace`` is the rule as BERT's Table 8 writes it ([MASK]/same/random %)."""
        return {"architecture": architecture, "mask_prob": self.mask_prob, "mask": self.mask, "random": self.random,
                "keep": self.keep, "replace": "/".join(f"{round(x * 100):d}" for x in (self.mask, self.keep,
                                                                                        self.random))}


RECIPES = {"bert": MaskRecipe(0.15), "modernbert": MaskRecipe(0.30)}
DEFAULT_RECIPE = "bert"  # for a backbone not in RECIPES (logged)
# the rows of BERT's masking ablation (Devlin et al., 2019, Table 8), written as its columns are: the shares (%) of
# the chosen tokens that become [MASK] / stay the SAME / become a RaNDom token
BERT_ABLATION = ("80/10/10", "100/0/0", "80/0/20", "80/20/0", "0/20/80", "0/0/100")


def parse_replacement(rule: str) -> tuple[float, float]:
    """``MASK/SAME/RND`` percentages (BERT's Table 8 order, summing to 100) -> (mask share, random share)."""
    try:
        mask, same, rnd = (int(x) for x in rule.split("/"))
    except ValueError:
        raise RetrError(f"--replace {rule!r}: write MASK/SAME/RND percentages, e.g. 80/10/10") from None
    if min(mask, same, rnd) < 0 or mask + same + rnd != 100:
        raise RetrError(f"--replace {rule!r}: three percentages >= 0 that sum to 100 ([MASK]/same/random)")
    return mask / 100, rnd / 100


def recipe_for(architecture: str | None, mask_prob: float | None,
               replace: str | None = None) -> tuple[str, MaskRecipe]:
    """The backbone's recipe (BERT's for one retr does not know), with ``mask_prob`` and the ``replace`` rule
    (``MASK/SAME/RND``) when given."""
    name = architecture if architecture in RECIPES else DEFAULT_RECIPE
    if architecture not in RECIPES:
        logger.info("no MLM recipe for %r: using %s's", architecture, DEFAULT_RECIPE)
    recipe = RECIPES[name]
    mask, rnd = parse_replacement(replace) if replace is not None else (recipe.mask, recipe.random)
    return architecture or name, MaskRecipe(recipe.mask_prob if mask_prob is None else mask_prob, mask, rnd)


@dataclass(frozen=True)
class MLMTrainConfig(TrainConfig):
    warmup_ratio: float = 0.06
    mask_prob: float | None = None  # None: the backbone's recipe (RECIPES)
    replace: str | None = None  # MASK/SAME/RND percentages of the chosen tokens; None: the recipe's (80/10/10)
    whole_word: bool = False
    dev_fraction: float = 0.05
    packing: str = "documents"  # documents | pairs | segments (train/packing.py)
    nsp: bool = False  # next-sentence prediction on [CLS] beside MLM (pairs or segments; BERT backbones)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_packing(self.packing, self.nsp)
        check_float(self.dev_fraction, "--dev-fraction", 0.0, 1.0, open_low=True, open_high=True)
        if self.replace is not None:
            parse_replacement(self.replace)
        if self.mask_prob is not None:
            check_float(self.mask_prob, "--mask-prob", 0.0, 1.0, open_low=True, open_high=True)


def mask_tokens(input_ids, special, mask_id: int, allowed_random, prob: float, generator, word_ids=None,
                mask_share: float = 0.8, random_share: float = 0.1):
    """BERT masking (``mask_share`` / ``random_share`` / the rest kept: 80/10/10). ``input_ids`` (B, L) long; ``special`` (B, L) bool (specials and padding, never
    chosen); ``word_ids`` (B, L) long, -1 on specials, for whole-word masking. Returns (inputs, labels)
    with labels -100 where nothing is predicted. The input tensor is not modified."""
    import torch

    if word_ids is None:
        chosen = (torch.rand(input_ids.shape, generator=generator) < prob) & ~special  # (B, L)
    else:
        n_words = int(word_ids.max().item()) + 1 if word_ids.numel() else 0
        word_chosen = torch.rand((input_ids.shape[0], max(n_words, 1)), generator=generator) < prob  # (B, W)
        safe = word_ids.clamp(min=0)
        chosen = torch.gather(word_chosen, 1, safe) & (word_ids >= 0) & ~special  # (B, L)
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, -100))
    roll = torch.rand(input_ids.shape, generator=generator)  # one draw per position: 80 / 10 / 10
    to_mask = chosen & (roll < mask_share)
    to_random = chosen & (roll >= mask_share) & (roll < mask_share + random_share)
    inputs = input_ids.clone()
    inputs[to_mask] = mask_id
    picks = torch.randint(len(allowed_random), input_ids.shape, generator=generator)
    inputs[to_random] = allowed_random[picks][to_random]
    return inputs, labels


class MLMCollator:
    """Tokenises raw texts and masks them (a fresh random mask every time a text is seen)."""

    def __init__(self, tokenizer, cfg: MLMTrainConfig, recipe: MaskRecipe = RECIPES[DEFAULT_RECIPE],
                 seed: int | None = None):
        import torch

        self.tok = tokenizer
        self.cfg = cfg
        self.recipe = recipe
        specials = set(tokenizer.all_special_ids)
        self.allowed = torch.tensor([i for i in range(len(tokenizer)) if i not in specials], dtype=torch.long)
        # its own generator with ``seed``; else torch's global one, which the trainer seeds and restores from a
        # checkpoint on --resume (so a resumed run masks as the uninterrupted one did)
        self.gen = None if seed is None else torch.Generator().manual_seed(seed)

    def __call__(self, rows):
        import torch

        if "labels" in rows[0]:  # pre-masked rows (the dev set): pad only
            return _pad(rows, self.tok.pad_token_id or 0)
        pair = "text_b" in rows[0]
        enc = self.tok([r["text"] for r in rows], [r["text_b"] for r in rows] if pair else None,
                       truncation="longest_first", max_length=self.cfg.max_length, padding=True,
                       return_special_tokens_mask=True, return_tensors="pt")
        special = enc.pop("special_tokens_mask").bool() | (enc["attention_mask"] == 0)
        word_ids = None
        if self.cfg.whole_word:
            word_ids = torch.tensor([_word_ids(enc, i) for i in range(len(rows))])
        inputs, labels = mask_tokens(enc["input_ids"], special, self.tok.mask_token_id, self.allowed,
                                     self.recipe.mask_prob, self.gen, word_ids, self.recipe.mask, self.recipe.random)
        enc["input_ids"] = inputs
        enc["labels"] = labels
        if "next_sentence_label" in rows[0]:
            enc["next_sentence_label"] = torch.tensor([r["next_sentence_label"] for r in rows])
        return dict(enc)


def _word_ids(enc, i: int) -> list[int]:
    """Row ``i``'s word of each token, -1 on specials; B's words numbered after A's (each restarts at 0)."""
    words, seqs = enc.word_ids(i), enc.sequence_ids(i)
    offset = 1 + max((w for w, q in zip(words, seqs, strict=True) if q == 0 and w is not None), default=-1)
    return [-1 if w is None else w + offset * (q == 1) for w, q in zip(words, seqs, strict=True)]


def _pad(rows, pad_id: int) -> dict:
    """Pre-masked rows padded into one batch (a row's scalar next-sentence label as it is)."""
    import torch

    width = max(len(r["input_ids"]) for r in rows)
    fill = {"input_ids": pad_id, "labels": -100, "attention_mask": 0, "token_type_ids": 0}
    out = {k: torch.tensor([r[k] + [v] * (width - len(r[k])) for r in rows]) for k, v in fill.items() if k in rows[0]}
    if "next_sentence_label" in rows[0]:
        out["next_sentence_label"] = torch.tensor([r["next_sentence_label"] for r in rows])
    return out


def _mlm_only_loss(outputs, labels, num_items_in_batch=None):
    """The MLM loss of a model that also has a next-sentence head, trained without NSP."""
    import torch

    logits = outputs["prediction_logits"]
    return torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]).float(), labels.view(-1),
                                             ignore_index=-100)


def _load_model(source: str, ref, cfg: MLMTrainConfig, architecture: str):
    """BERT's pre-training model (MLM and [CLS] next-sentence heads) for two-segment inputs, so the [CLS] pooler
    goes on to the output trained by NSP or, without it, as the base had it; else an MLM model (a fresh MLM head
    where the base has none). Returns (model, the Trainer's loss for it or None for the model's own)."""
    from transformers import AutoModelForMaskedLM, AutoModelForPreTraining

    overrides = dropout_overrides(ref.path, cfg)
    if cfg.packing == "documents" or architecture != "bert":
        if cfg.nsp:
            raise RetrError(f"--nsp: a {architecture} backbone has no next-sentence head (BERT's has)")
        return AutoModelForMaskedLM.from_pretrained(source, **overrides), None
    model = AutoModelForPreTraining.from_pretrained(source, **overrides)
    return model, (None if cfg.nsp else _mlm_only_loss)


@training_run
def train_mlm(out: Path, cfg: MLMTrainConfig, corpus: Corpus, resume: bool = False) -> dict:
    from datasets import Dataset as HFDataset
    from transformers import AutoTokenizer, Trainer, TrainingArguments

    t0 = time.perf_counter()
    ref = ModelRef.resolve(cfg.base)
    source = str(ref.path)
    architecture, recipe = recipe_for(ref.architecture(), cfg.mask_prob, cfg.replace)
    tokenizer = AutoTokenizer.from_pretrained(source)
    if tokenizer.mask_token_id is None:
        raise RetrError(f"{source}: its tokenizer has no [MASK] token")
    model, loss = _load_model(source, ref, cfg, architecture)
    model.tie_weights()
    texts = [d.full_text() for d in corpus.docs if d.full_text().strip()]
    order = list(range(len(texts)))
    random.Random(cfg.seed).shuffle(order)
    n_dev = max(2 if cfg.nsp else 1, int(len(texts) * cfg.dev_fraction))
    if n_dev >= len(texts):
        raise RetrError(f"{corpus.source}: {len(texts)} documents with text: too few to hold {n_dev} out for dev")

    def count(parts: list[str]) -> list[int]:
        return [len(ids) for ids in tokenizer(parts, add_special_tokens=False)["input_ids"]]

    budget = cfg.max_length - tokenizer.num_special_tokens_to_add(pair=True)
    train_packed = pack([texts[i] for i in order[n_dev:]], cfg.packing, cfg.nsp, count, budget, cfg.seed)
    dev_packed = pack([texts[i] for i in order[:n_dev]], cfg.packing, cfg.nsp, count, budget, cfg.seed + 1)
    collator = MLMCollator(tokenizer, cfg, recipe)
    fixed = MLMCollator(tokenizer, cfg, recipe, seed=cfg.seed)  # the dev set masked once: dev losses comparable
    dev_rows = dev_packed.rows()
    dev_masked = [fixed([{k: v[j] for k, v in dev_rows.items()}]) for j in range(len(dev_packed.a))]
    dev = HFDataset.from_dict({k: [r[k][0].tolist() for r in dev_masked] for k in dev_masked[0]})
    train = HFDataset.from_dict(train_packed.rows())
    label_names = ["labels", "next_sentence_label"] if cfg.nsp else ["labels"]
    args = TrainingArguments(**common_training_args(out, cfg, len(train), log_every=20),
                             per_device_eval_batch_size=cfg.batch_size, metric_for_best_model="eval_loss",
                             greater_is_better=False, remove_unused_columns=False, label_names=label_names)
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=dev,
                      data_collator=collator, compute_loss_func=loss)
    objective = "MLM+NSP" if cfg.nsp else "MLM"
    result = run_trainer(trainer, out, resume, eval_key="eval_loss", name="dev_mlm_loss", best=min,
                         label=f"dev {objective} loss", evaluate_first=True)
    if result["dev_mlm_loss"] is None:
        result["dev_mlm_loss"] = result["dev_mlm_loss_before"]
    extra = {"base": cfg.base_name, "recipe": recipe.to_dict(architecture), "corpus_sha256": corpus.sha256,
             "train_docs": len(texts) - n_dev, "dev_docs": n_dev,
             "packing": {"packing": cfg.packing, "nsp": cfg.nsp, "objective": objective.lower(),
                         "train": train_packed.summary(), "dev": dev_packed.summary()},
             **result, "train_seconds": time.perf_counter() - t0}

    def save(p: Path) -> None:
        trainer.model.save_pretrained(str(p))
        tokenizer.save_pretrained(str(p))

    return write_output(out, save, "retr-mlm", cfg, extra)
