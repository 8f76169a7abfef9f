"""Shared fixtures: a tiny hand-written corpus, tiny random BERT bi-/cross-encoders built here."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "datasets"

DOCS = [
    ("d1", "Solar power", "Solar panels convert sunlight into electricity using photovoltaic cells."),
    ("d2", "Wind energy", "Wind turbines turn the kinetic energy of moving air into electricity."),
    ("d3", "Hydro power", "Dams hold water whose flow drives turbines that produce electricity."),
    ("d4", "Coffee", "Coffee beans are roasted, ground and brewed with hot water."),
    ("d5", "Tea", "Tea leaves are steeped in hot water to brew a drink."),
    ("d6", "Bread", "Bread dough rises with yeast before it is baked in an oven."),
    ("d7", "Cats", "Cats are small carnivorous mammals often kept as pets."),
    ("d8", "Dogs", "Dogs are loyal pets descended from wolves."),
    ("d9", "Wolves", "Wolves hunt in packs and live in forests and tundra."),
    ("d10", "Rivers", "Rivers carry water from mountains to the sea."),
    ("d11", "Mountains", "Mountains form where tectonic plates collide and push rock upward."),
    ("d12", "Volcanoes", "Volcanoes erupt molten rock called lava from inside the earth."),
    ("d13", "", "Photovoltaic cells and batteries store solar electricity for the night."),
    ("d14", "Ovens", "An oven bakes bread, cakes and roasts with dry heat."),
    ("d15", "", ""),
    ("d16", "Tundra", "The tundra is a cold treeless plain where wolves and caribou roam."),
]
QUERIES = {
    "q1": "how do solar panels make electricity",
    "q2": "brewing coffee or tea with hot water",
    "q3": "pets like cats and dogs",
    "q4": "where do wolves live",
    "q5": "lava from volcanoes",
    "q6": "zzzz unknownword",
}
QRELS = {
    "q1": {"d1": 2, "d13": 1, "d2": 0},
    "q2": {"d4": 1, "d5": 1},
    "q3": {"d7": 2, "d8": 2, "d9": 0},
    "q4": {"d9": 2, "d16": 1},
    "q5": {"d12": 1},
    "q6": {"d11": 1},
}


def write_beir(folder: Path, docs=DOCS, queries=QUERIES, qrels=QRELS, split: str = "test") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "corpus.jsonl").open("w", encoding="utf-8") as fh:
        for did, title, text in docs:
            fh.write(json.dumps({"_id": did, "title": title, "text": text}) + "\n")
    with (folder / "queries.jsonl").open("w", encoding="utf-8") as fh:
        for qid, text in queries.items():
            fh.write(json.dumps({"_id": qid, "text": text}) + "\n")
    (folder / "qrels").mkdir(exist_ok=True)
    with (folder / "qrels" / f"{split}.tsv").open("w", encoding="utf-8") as fh:
        fh.write("query-id\tcorpus-id\tscore\n")
        for qid, docs_ in qrels.items():
            for did, g in docs_.items():
                fh.write(f"{qid}\t{did}\t{g}\n")
    return folder


def _vocab() -> list[str]:
    words = set()
    for _, title, text in DOCS:
        words.update(re.findall(r"\w+", f"{title} {text}".lower()))
    for q in QUERIES.values():
        words.update(re.findall(r"\w+", q.lower()))
    return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *sorted(words)]


def _tiny_bert_config(vocab_size: int):
    from transformers import BertConfig

    return BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=37, max_position_embeddings=128)


def _tokenizer(folder: Path):
    """A WordPiece tokenizer whose vocabulary is the fixture corpus's words; a fast one, so that its folder holds a
    tokenizer.json as real models' folders do (retr then tokenises without loading the torch model)."""
    from transformers import BertTokenizerFast as BertTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    vocab = _vocab()
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    try:  # transformers >= 5
        tok = BertTokenizer(vocab=str(folder / "vocab.txt"), do_lower_case=True, model_max_length=128)
    except TypeError:  # pragma: no cover - transformers 4
        tok = BertTokenizer(vocab_file=str(folder / "vocab.txt"), do_lower_case=True, model_max_length=128)
    assert len(tok) == len(vocab), "the fixture tokenizer must know the corpus words"
    assert tok.convert_tokens_to_ids("solar") != tok.unk_token_id
    return tok


@pytest.fixture(scope="session")
def tiny_bi_encoder(tmp_path_factory) -> Path:
    """A random 2-layer BERT with mean pooling + normalisation, saved as a sentence-transformers folder."""
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import BertModel

    try:  # sentence-transformers >= 6
        from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    except ImportError:  # pragma: no cover
        from sentence_transformers.models import Normalize, Pooling, Transformer

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("tiny-bi")
    bert_dir = root / "bert"
    tok = _tokenizer(bert_dir)
    BertModel(_tiny_bert_config(tok.vocab_size)).save_pretrained(bert_dir)
    tok.save_pretrained(bert_dir)
    word = Transformer(str(bert_dir), max_seq_length=64)
    model = SentenceTransformer(modules=[word, Pooling(32, "mean"), Normalize()], device="cpu")
    out = root / "st"
    model.save(str(out))
    return out


@pytest.fixture(scope="session")
def tiny_modernbert(tmp_path_factory) -> Path:
    """A random 3-layer ModernBERT (RoPE, GeGLU, local attention every other layer) with the fixture's WordPiece
    vocabulary, saved as a plain transformers folder (what `retr train --base` takes)."""
    import torch
    from transformers import ModernBertConfig, ModernBertModel

    torch.manual_seed(2)
    out = tmp_path_factory.mktemp("tiny-modernbert")
    tok = _tokenizer(out)
    cfg = ModernBertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                           intermediate_size=48, max_position_embeddings=128, global_attn_every_n_layers=2,
                           local_attention=16, pad_token_id=tok.pad_token_id, cls_token_id=tok.cls_token_id,
                           sep_token_id=tok.sep_token_id, bos_token_id=tok.cls_token_id,
                           eos_token_id=tok.sep_token_id)
    ModernBertModel(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_cross_encoder(tmp_path_factory) -> Path:
    """A random 2-layer BERT with a one-logit head (a cross-encoder folder)."""
    import torch
    from transformers import BertForSequenceClassification

    torch.manual_seed(1)
    out = tmp_path_factory.mktemp("tiny-ce")
    tok = _tokenizer(out)
    cfg = _tiny_bert_config(tok.vocab_size)
    cfg.num_labels = 1
    BertForSequenceClassification(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory) -> Path:
    return write_beir(tmp_path_factory.mktemp("tiny-beir") / "tiny")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """Every test gets its own embedding/index cache and an empty data home; never the network."""
    monkeypatch.setenv("RETR_CACHE", str(tmp_path / "retr-cache"))
    monkeypatch.setenv("RETR_DATA", str(tmp_path / "retr-data"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    # static int8 graphs are built and used on any CPU under test (elsewhere only where int8 dot products exist);
    # tests of that choice set it to "0"
    monkeypatch.setenv("RETR_INT8_DOT", "1")


def pytest_configure(config):
    """Module- and session-scoped fixtures run before the per-test environment: point them away from
    the user's own cache and data too, so a test run never writes under ~/.cache."""
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="retr-tests-"))
    os.environ["RETR_CACHE"] = str(root / "cache")
    os.environ["RETR_DATA"] = str(root / "data")
    os.environ["HF_HUB_OFFLINE"] = "1"


# The test tiers, declared here once (no marker is written in a test file).
# `slow`: needs a real model (the bundled MiniLM), a real collection (../shared/datasets), a browser, a Ray
# cluster, a served process, or builds and times graphs for seconds. The fast tier, `python -m pytest -m "not slow"`,
# is what a contributor runs while working; CI runs every tier (`python -m pytest`).
SLOW_MODULES = frozenset()
SLOW_TESTS = frozenset()
# `cpu`: tests whose outcome may follow the host's instructions (graphs built, quantised, compiled and chosen).
# CI runs them a second time as an AVX2-only CPU would (`ONEDNN_MAX_CPU_ISA=AVX2 python -m pytest -m cpu`).
CPU_MODULES = frozenset()


def _tier_of(item) -> tuple[bool, bool]:
    module = item.path.stem
    name = item.nodeid.split("::", 1)[-1].split("[", 1)[0]
    return module in SLOW_MODULES or f"{module}::{name}" in SLOW_TESTS, module in CPU_MODULES


def pytest_collection_modifyitems(config, items):
    for item in items:
        slow, cpu = _tier_of(item)
        if slow:
            item.add_marker(pytest.mark.slow)
        if cpu:
            item.add_marker(pytest.mark.cpu)


@pytest.fixture(scope="session")
def tiny_train(tmp_path_factory) -> Path:
    """The fixture corpus with a train split (four more judged queries) for the trainers."""
    qrels = {**QRELS, "q7": {"d3": 1}, "q8": {"d14": 1}, "q9": {"d6": 1}, "q10": {"d10": 1}}
    queries = {**QUERIES, "q7": "dams and turbines", "q8": "baking in an oven", "q9": "bread dough with yeast",
               "q10": "rivers flow to the sea"}
    return write_beir(tmp_path_factory.mktemp("train") / "tiny", DOCS, queries, qrels, split="train")
