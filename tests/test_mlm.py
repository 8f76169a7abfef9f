"""MLM masking statistics (BERT's 80/10/10, whole words intact, specials never masked) and a tiny run."""

from __future__ import annotations

import pytest
import torch

from retr.train.mlm import MLMTrainConfig, mask_tokens

MASK, CLS, SEP, PAD = 4, 2, 3, 0


def _batch(n_rows=200, length=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 1000, (n_rows, length), generator=g)
    ids[:, 0], ids[:, -1] = CLS, SEP
    ids[:10, 40:] = PAD  # some padding
    special = (ids == CLS) | (ids == SEP) | (ids == PAD)
    return ids, special


def test_bert_masking_statistics_over_many_tokens():
    ids, special = _batch()
    allowed = torch.arange(5, 1000)
    inputs, labels = mask_tokens(ids, special, MASK, allowed, 0.15, torch.Generator().manual_seed(1))
    eligible = int((~special).sum())
    chosen = labels != -100
    assert eligible >= 10_000
    assert abs(int(chosen.sum()) / eligible - 0.15) < 0.01
    assert not (chosen & special).any(), "special tokens and padding are never chosen"
    assert torch.equal(labels[chosen], ids[chosen]), "labels are the original tokens"
    n = int(chosen.sum())
    masked = int((inputs[chosen] == MASK).sum())
    kept = int((inputs[chosen] == ids[chosen]).sum())
    randomised = n - masked - kept
    assert abs(masked / n - 0.8) < 0.02
    assert abs(kept / n - 0.1) < 0.02  # (a random draw equal to the original counts as kept: ~0.1% here)
    assert abs(randomised / n - 0.1) < 0.02
    assert torch.equal(inputs[~chosen], ids[~chosen]), "nothing else changes"
    assert not ((inputs == MASK) & ~chosen).any()
    assert torch.equal(ids, _batch()[0]), "the input is not modified"


def test_whole_word_masking_keeps_words_intact():
    ids, special = _batch(300, 60, seed=2)
    # words of 1-3 pieces
    word_ids = torch.full(ids.shape, -1)
    g = torch.Generator().manual_seed(3)
    for r in range(ids.shape[0]):
        w, pos = 0, 1
        while pos < ids.shape[1] - 1:
            size = int(torch.randint(1, 4, (1,), generator=g))
            word_ids[r, pos:min(pos + size, ids.shape[1] - 1)] = w
            w, pos = w + 1, pos + size
    word_ids[special] = -1
    inputs, labels = mask_tokens(ids, special, MASK, torch.arange(5, 1000), 0.15,
                                 torch.Generator().manual_seed(4), word_ids)
    chosen = labels != -100
    for r in range(ids.shape[0]):
        for w in word_ids[r].unique().tolist():
            if w < 0:
                continue
            pieces = chosen[r][(word_ids[r] == w) & ~special[r]]
            assert pieces.all() or not pieces.any(), "a word is chosen whole or not at all"
    words = {(r, w) for r in range(ids.shape[0]) for w in word_ids[r].unique().tolist() if w >= 0}
    rows, cols = torch.nonzero(chosen, as_tuple=True)
    chosen_words = {(int(r), int(word_ids[r, c])) for r, c in zip(rows.tolist(), cols.tolist(), strict=True)}
    assert len(words) >= 5_000 and abs(len(chosen_words) / len(words) - 0.15) < 0.015
    assert not (chosen & special).any()


def test_tiny_mlm_run_adds_a_tied_head_and_writes_a_bert_folder(tiny_bi_encoder, tiny_dataset, tmp_path):
    from transformers import AutoModel, AutoModelForMaskedLM

    from retr.indexes.corpus import load_corpus
    from retr.train.mlm import train_mlm

    out = tmp_path / "mlm"
    m = train_mlm(out, MLMTrainConfig(base=str(tiny_bi_encoder.parent / "bert"), epochs=5, batch_size=4,
                                      learning_rate=5e-3, max_length=32, dev_fraction=0.2, whole_word=True),
                  load_corpus(tiny_dataset))
    assert m["loss_history"][-1] < m["loss_history"][0]
    assert m["dev_mlm_loss"] <= m["dev_mlm_loss_before"]
    assert m["recipe"] == {"architecture": "bert", "mask_prob": 0.15, "mask": 0.8, "random": 0.1, "keep": 0.1}
    assert m["architecture"] == "bert"
    mlm = AutoModelForMaskedLM.from_pretrained(out)
    assert mlm.get_output_embeddings().weight.data_ptr() == mlm.get_input_embeddings().weight.data_ptr()
    assert AutoModel.from_pretrained(out).config.hidden_size == 32  # usable as --base
    assert (out / "model.safetensors").is_file() and (out / "retr_manifest.json").is_file()


@pytest.mark.parametrize("prob", [0.0, 1.0])
def test_mask_prob_extremes(prob):
    ids, special = _batch(4, 16)
    _, labels = mask_tokens(ids, special, MASK, torch.arange(5, 1000), prob, torch.Generator().manual_seed(0))
    assert int((labels != -100).sum()) == (0 if prob == 0.0 else int((~special).sum()))


@pytest.mark.parametrize("architecture,share", [("bert", 0.15), ("modernbert", 0.30), ("unknown", 0.15)])
def test_each_backbone_masks_by_its_own_recipe(architecture, share):
    from retr.train.mlm import recipe_for

    name, recipe = recipe_for(architecture, None)
    assert recipe.mask_prob == share and name == architecture
    ids, special = _batch(256, 128)
    inputs, labels = mask_tokens(ids, special, MASK, torch.arange(5, 1000), recipe.mask_prob,
                                 torch.Generator().manual_seed(0), mask_share=recipe.mask, random_share=recipe.random)
    chosen = labels != -100
    assert abs(float(chosen.sum()) / float((~special).sum()) - share) < 0.01
    assert abs(float((inputs[chosen] == MASK).float().mean()) - 0.8) < 0.02
    assert recipe_for("modernbert", 0.5)[1].mask_prob == 0.5, "--mask-prob overrides the recipe"
