"""MLM masking statistics (BERT's 80/10/10, whole words intact, specials never masked) and a tiny run."""

from __future__ import annotations

import json

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
    losses = m["loss_history"]  # ~3 masked tokens a step: compare the first and last thirds, not two steps
    third = len(losses) // 3
    assert third >= 2 and sum(losses[-third:]) < sum(losses[:third])
    assert m["dev_mlm_loss"] <= m["dev_mlm_loss_before"]
    assert m["recipe"] == {"architecture": "bert", "mask_prob": 0.15, "mask": 0.8, "random": 0.1, "keep": 0.1,
                           "replace": "80/10/10"}
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


# --- the replacement rules of BERT's ablation (Devlin et al., Table 8: [MASK] / same / random) ---------------------

def _within(count: int, n: int, p: float, z: float = 5.0) -> bool:
    """``count`` of ``n`` draws is within ``z`` binomial standard deviations of ``n * p`` (exactly it where p is 0
    or 1): z = 5 leaves a ~6e-7 chance of a false failure a check, and the batch and seed are fixed anyway."""
    return abs(count - n * p) <= z * (n * p * (1 - p)) ** 0.5


@pytest.mark.parametrize("rule", ["80/10/10", "100/0/0", "80/0/20", "80/20/0", "0/20/80", "0/0/100"])
def test_each_replacement_rule_gives_its_shares_of_mask_same_and_random(rule):
    from retr.train.mlm import BERT_ABLATION, recipe_for

    assert rule in BERT_ABLATION
    mask_pct, same_pct, rnd_pct = (int(x) / 100 for x in rule.split("/"))
    _, recipe = recipe_for("bert", None, rule)
    assert (recipe.mask, recipe.keep, recipe.random) == pytest.approx((mask_pct, same_pct, rnd_pct))
    assert recipe.to_dict("bert")["replace"] == rule
    ids, special = _batch(256, 128)
    allowed = torch.arange(5, 1000)
    inputs, labels = mask_tokens(ids, special, MASK, allowed, recipe.mask_prob, torch.Generator().manual_seed(7),
                                 mask_share=recipe.mask, random_share=recipe.random)
    chosen = labels != -100
    eligible, n = int((~special).sum()), int(chosen.sum())
    assert _within(n, eligible, 0.15)
    masked = int((inputs[chosen] == MASK).sum())
    same = int((inputs[chosen] == ids[chosen]).sum())
    other = n - masked - same
    # a random token drawn equal to the original one reads as kept: 1 in len(allowed) of the random ones
    p_coincide = 1 / len(allowed)
    assert _within(masked, n, mask_pct), (rule, masked / n)
    assert _within(same, n, same_pct + rnd_pct * p_coincide), (rule, same / n)
    assert _within(other, n, rnd_pct * (1 - p_coincide)), (rule, other / n)
    assert not ((inputs[chosen] != MASK) & (inputs[chosen] != ids[chosen]) & ~torch.isin(inputs[chosen],
                                                                                         allowed)).any()
    assert torch.equal(inputs[~chosen], ids[~chosen]), "what is not chosen never changes"


@pytest.mark.parametrize("rule", ["80/10", "80/10/5", "-10/100/10", "a/b/c"])
def test_a_replacement_rule_that_is_not_three_shares_of_100_is_refused(rule):
    from retr.retrieval.errors import RetrError

    with pytest.raises(RetrError, match="--replace"):
        MLMTrainConfig(replace=rule)


# --- packing and next-sentence prediction ---------------------------------------------------------------------------

PARAGRAPHS = [
    "Solar panels convert sunlight. Photovoltaic cells make electricity. Batteries store it for the night.",
    "Wind turbines turn air into electricity. Dams hold water. Its flow drives turbines.",
    "Coffee beans are roasted. They are ground and brewed. Tea leaves are steeped in hot water.",
    "Cats are small mammals. Dogs are loyal pets. Wolves hunt in packs. They live in forests and tundra.",
    "Rivers carry water to the sea. Mountains form where plates collide. Volcanoes erupt lava.",
    "Bread dough rises with yeast. It is baked in an oven. An oven bakes cakes with dry heat.",
]


def _count(parts):
    return [len(p.split()) for p in parts]


def test_pairs_are_each_sentence_and_the_next_and_nsp_makes_exactly_half_another_documents():
    from retr.train.packing import IS_NEXT, NOT_NEXT, pack, sentences

    plain = pack(PARAGRAPHS, "pairs", False, _count, 100, seed=0)
    expected = [(s[i], s[i + 1]) for s in map(sentences, PARAGRAPHS) for i in range(len(s) - 1)]
    assert list(zip(plain.a, plain.b, strict=True)) == expected and plain.next_label is None
    nsp = pack(PARAGRAPHS, "pairs", True, _count, 100, seed=0)
    assert nsp.a == plain.a
    assert sum(nsp.next_label) == len(nsp.a) // 2 and set(nsp.next_label) == {IS_NEXT, NOT_NEXT}
    home = {s: i for i, p in enumerate(PARAGRAPHS) for s in sentences(p)}
    for a, b, b0, label in zip(nsp.a, nsp.b, plain.b, nsp.next_label, strict=True):
        if label == IS_NEXT:
            assert b == b0
        else:
            assert home[b] != home[a], "a NotNext second segment comes from another document"
    assert nsp.summary() == {"examples": len(nsp.a), "not_next": len(nsp.a) // 2}


@pytest.mark.parametrize("budget", [8, 14, 100])
def test_segments_are_contiguous_runs_within_the_budget_cut_in_two(budget):
    from retr.train.packing import pack, sentences

    packed = pack(PARAGRAPHS, "segments", False, _count, budget, seed=3)
    joined = [f"{a} {b}" for a, b in zip(packed.a, packed.b, strict=True)]
    for text in joined:
        home = [p for p in PARAGRAPHS if text in p]
        assert home, "a segment pair is contiguous text of one document"
        if len(sentences(text)) > 1:
            assert len(text.split()) <= budget
    if budget == 100:  # every paragraph fits: one example each, the whole paragraph
        assert joined == PARAGRAPHS
    assert all(a and b for a, b in zip(packed.a, packed.b, strict=True))


def test_nsp_needs_two_segments_and_a_bert_head():
    from retr.retrieval.errors import RetrError

    with pytest.raises(RetrError, match="--nsp needs"):
        MLMTrainConfig(nsp=True)
    with pytest.raises(RetrError, match="unknown packing"):
        MLMTrainConfig(packing="sentences")
    for fraction in (0.0, 1.0):
        with pytest.raises(RetrError, match="--dev-fraction"):
            MLMTrainConfig(dev_fraction=fraction)


def _paragraph_corpus(folder):
    from .conftest import write_beir

    docs = [(f"p{i}", "", text) for i, text in enumerate(PARAGRAPHS * 3)]
    return write_beir(folder, docs=docs)


@pytest.mark.parametrize("packing,nsp", [("pairs", True), ("segments", True), ("pairs", False)])
def test_tiny_run_with_packing_records_it_and_keeps_a_cls_head(tiny_bi_encoder, tmp_path, packing, nsp):
    from safetensors import safe_open

    from retr.indexes.corpus import load_corpus
    from retr.train.mlm import train_mlm

    base = tiny_bi_encoder.parent / "bert"
    out = tmp_path / "mlm"
    m = train_mlm(out, MLMTrainConfig(base=str(base), epochs=2, batch_size=4, learning_rate=5e-3, max_length=24,
                                      dev_fraction=0.2, packing=packing, nsp=nsp, replace="100/0/0"),
                  load_corpus(_paragraph_corpus(tmp_path / "c")))
    assert m["config"]["packing"] == packing and m["config"]["nsp"] is nsp
    assert m["packing"]["objective"] == ("mlm+nsp" if nsp else "mlm")
    train = m["packing"]["train"]
    assert train["not_next"] == (train["examples"] // 2 if nsp else None)
    assert m["recipe"]["replace"] == "100/0/0"
    assert m["loss_history"][-1] < m["loss_history"][0]
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert "cls.seq_relationship.weight" in keys, "the [CLS] next-sentence head is saved"
        pooler = f.get_tensor("bert.pooler.dense.weight")
    with safe_open(str(base / "model.safetensors"), "pt") as f:
        base_pooler = f.get_tensor("pooler.dense.weight")
    assert torch.equal(pooler, base_pooler) is (not nsp), "only NSP trains the [CLS] pooler"


def test_a_modernbert_backbone_refuses_nsp(tiny_modernbert, tmp_path):
    from retr.indexes.corpus import load_corpus
    from retr.retrieval.errors import RetrError
    from retr.train.mlm import train_mlm

    with pytest.raises(RetrError, match="no next-sentence head"):
        train_mlm(tmp_path / "m", MLMTrainConfig(base=str(tiny_modernbert), packing="pairs", nsp=True),
                  load_corpus(_paragraph_corpus(tmp_path / "c")))
    assert not (tmp_path / "m").exists()


# --- resume after a kill -------------------------------------------------------------------------------------------

KILL_AT_CHECKPOINT = """
import os, signal, sys
from transformers import Trainer
from retr.cli.main import main

save = Trainer._save_checkpoint

def save_then_die(self, *args, **kwargs):
    save(self, *args, **kwargs)
    if self.state.global_step >= int(os.environ["KILL_AT_STEP"]):
        os.kill(os.getpid(), signal.SIGKILL)

Trainer._save_checkpoint = save_then_die
sys.exit(main())
"""


def test_a_run_killed_at_a_checkpoint_and_resumed_ends_as_the_uninterrupted_one(tiny_bi_encoder, tmp_path):
    import os
    import subprocess
    import sys

    from safetensors.torch import load_file

    corpus = _paragraph_corpus(tmp_path / "c")
    common = ["train", "mlm", "--corpus", str(corpus), "--base", str(tiny_bi_encoder.parent / "bert"),
              "--epochs", "3", "--batch-size", "4", "--lr", "5e-3", "--max-length", "24", "--packing", "segments",
              "--nsp", "--replace", "80/10/10", "--whole-word"]
    env = {**os.environ, "KILL_AT_STEP": "1", "OMP_NUM_THREADS": "1"}

    def run(out, *extra, kill=False):
        code = KILL_AT_CHECKPOINT if kill else "import sys; from retr.cli.main import main; sys.exit(main())"
        return subprocess.run([sys.executable, "-c", code, *common, "--out", str(out), *extra], env=env,
                              capture_output=True, text=True, timeout=300)

    whole = run(tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr
    killed = run(tmp_path / "cut", kill=True)
    assert killed.returncode == -9, killed.stderr
    assert not (tmp_path / "cut").exists() and any((tmp_path / ".cut.checkpoints").glob("checkpoint-*"))
    resumed = run(tmp_path / "cut", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    manifest = json.loads((tmp_path / "cut" / "retr_manifest.json").read_text())
    assert manifest["resumed_from"] and manifest["steps"] == json.loads(
        (tmp_path / "whole" / "retr_manifest.json").read_text())["steps"]
    a, b = load_file(tmp_path / "whole" / "model.safetensors"), load_file(tmp_path / "cut" / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.allclose(a[key], b[key], atol=1e-6, rtol=0), key
    # the weights moved from the base: the comparison can tell runs apart
    base = load_file(tiny_bi_encoder.parent / "bert" / "model.safetensors")
    assert not torch.equal(a["bert.embeddings.word_embeddings.weight"], base["embeddings.word_embeddings.weight"])
