"""`retr train mlm`: domain-adaptive masked-language modelling, each backbone with its own recipe.

Of the tokens chosen for prediction (``mask_prob`` of the non-special tokens, or of the words with
``whole_word``: then every word-piece of a chosen word), 80% become [MASK], 10% a random token and
10% stay as they are (BERT's rule). How many are chosen follows the backbone's pre-training: 15% for BERT
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
from retr.train.runtime import training_run

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MaskRecipe:
    mask_prob: float  # share of the (non-special) tokens chosen for prediction
    mask: float = 0.8  # of those: replaced by [MASK]
    random: float = 0.1  # replaced by a random token (the rest stay as they are)

    def to_dict(self, architecture: str) -> dict:
        return {"architecture": architecture, "mask_prob": self.mask_prob, "mask": self.mask, "random": self.random,
                "keep": round(1.0 - self.mask - self.random, 10)}


RECIPES = {"bert": MaskRecipe(0.15), "modernbert": MaskRecipe(0.30)}
DEFAULT_RECIPE = "bert"  # for a backbone not in RECIPES (logged)


def recipe_for(architecture: str | None, mask_prob: float | None) -> tuple[str, MaskRecipe]:
    """The backbone's recipe (BERT's for one retr does not know), with ``mask_prob`` when given."""
    name = architecture if architecture in RECIPES else DEFAULT_RECIPE
    if architecture not in RECIPES:
        logger.info("no MLM recipe for %r: using %s's", architecture, DEFAULT_RECIPE)
    recipe = RECIPES[name]
    if mask_prob is not None:
        recipe = MaskRecipe(mask_prob, recipe.mask, recipe.random)
    return architecture or name, recipe


@dataclass(frozen=True)
class MLMTrainConfig(TrainConfig):
    warmup_ratio: float = 0.06
    mask_prob: float | None = None  # None: the backbone's recipe (RECIPES)
    whole_word: bool = False
    dev_fraction: float = 0.05

    def __post_init__(self) -> None:
        super().__post_init__()
        check_float(self.dev_fraction, "--dev-fraction", 0.0, 1.0, open_high=True)
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

    def __init__(self, tokenizer, cfg: MLMTrainConfig, recipe: MaskRecipe = RECIPES[DEFAULT_RECIPE]):
        import torch

        self.tok = tokenizer
        self.cfg = cfg
        self.recipe = recipe
        specials = set(tokenizer.all_special_ids)
        self.allowed = torch.tensor([i for i in range(len(tokenizer)) if i not in specials], dtype=torch.long)
        self.gen = torch.Generator().manual_seed(cfg.seed)

    def __call__(self, rows):
        import torch

        if "labels" in rows[0]:  # pre-masked rows (the dev set): pad only
            width = max(len(r["input_ids"]) for r in rows)

            def pad(key, value):
                return torch.tensor([r[key] + [value] * (width - len(r[key])) for r in rows])

            return {"input_ids": pad("input_ids", self.tok.pad_token_id or 0), "labels": pad("labels", -100),
                    "attention_mask": pad("attention_mask", 0)}
        enc = self.tok([r["text"] for r in rows], truncation=True, max_length=self.cfg.max_length, padding=True,
                       return_special_tokens_mask=True, return_tensors="pt")
        special = enc.pop("special_tokens_mask").bool() | (enc["attention_mask"] == 0)
        word_ids = None
        if self.cfg.whole_word:
            word_ids = torch.tensor([[-1 if w is None else w for w in enc.word_ids(i)] for i in range(len(rows))])
        inputs, labels = mask_tokens(enc["input_ids"], special, self.tok.mask_token_id, self.allowed,
                                     self.recipe.mask_prob, self.gen, word_ids, self.recipe.mask, self.recipe.random)
        enc["input_ids"] = inputs
        enc["labels"] = labels
        return dict(enc)


@training_run
def train_mlm(out: Path, cfg: MLMTrainConfig, corpus: Corpus, resume: bool = False) -> dict:
    import torch
    from datasets import Dataset as HFDataset
    from transformers import AutoModelForMaskedLM, AutoTokenizer, Trainer, TrainingArguments

    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    ref = ModelRef.resolve(cfg.base)
    source = str(ref.path)
    architecture, recipe = recipe_for(ref.architecture(), cfg.mask_prob)
    tokenizer = AutoTokenizer.from_pretrained(source)
    if tokenizer.mask_token_id is None:
        raise RetrError(f"{source}: its tokenizer has no [MASK] token")
    # adds a fresh MLM head where there is none
    model = AutoModelForMaskedLM.from_pretrained(source, **dropout_overrides(ref.path, cfg))
    model.tie_weights()
    texts = [d.full_text() for d in corpus.docs if d.full_text().strip()]
    order = list(range(len(texts)))
    random.Random(cfg.seed).shuffle(order)
    n_dev = max(1, int(len(texts) * cfg.dev_fraction))
    collator = MLMCollator(tokenizer, cfg, recipe)
    fixed = MLMCollator(tokenizer, cfg, recipe)  # the dev set is masked once, so dev losses are comparable
    dev_rows = [fixed([{"text": texts[i]}]) for i in order[:n_dev]]
    dev = HFDataset.from_dict({k: [r[k][0].tolist() for r in dev_rows] for k in ("input_ids", "labels",
                                                                                "attention_mask")})
    train = HFDataset.from_dict({"text": [texts[i] for i in order[n_dev:]]})
    args = TrainingArguments(**common_training_args(out, cfg, len(train), log_every=20),
                             per_device_eval_batch_size=cfg.batch_size, metric_for_best_model="eval_loss",
                             greater_is_better=False, remove_unused_columns=False)
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=dev,
                      data_collator=collator)
    result = run_trainer(trainer, out, resume, eval_key="eval_loss", name="dev_mlm_loss", best=min,
                         label="dev MLM loss", evaluate_first=True)
    if result["dev_mlm_loss"] is None:
        result["dev_mlm_loss"] = result["dev_mlm_loss_before"]
    extra = {"base": cfg.base_name, "recipe": recipe.to_dict(architecture), "corpus_sha256": corpus.sha256, "train_docs": len(train),
             "dev_docs": len(dev), **result,
             "train_seconds": time.perf_counter() - t0}

    def save(p: Path) -> None:
        trainer.model.save_pretrained(str(p))
        tokenizer.save_pretrained(str(p))

    return write_output(out, save, "retr-mlm", cfg, extra)
