"""Training: the contrastive loss by hand, cached == plain gradients, a tiny run that learns, --resume."""

from __future__ import annotations

import json

import pytest

from retr.eval.data import load_dataset
from retr.retrieval.errors import RetrError
from retr.train import common
from retr.train.bi_encoder import BiEncoderTrainConfig, train_bi_encoder
from retr.train.common import TrainConfig
from retr.train.data import labeled_pairs, self_supervised_pairs, split_dev


def test_negative_mining_never_takes_a_judged_or_near_duplicate_document(tmp_path):
    from retr.retrieval.types import Qrels
    from retr.train.data import Pair
    from retr.train.negatives import mine_bm25_negatives, temporary_bm25

    docs = {
        "pos": "solar panels turn sunlight into electricity",
        "dup": "solar panels turn sunlight into electricity",  # a copy of the positive under another id: unjudged
        "judged0": "solar panels and sunlight",  # judged non-relevant: never a negative either
        "other1": "solar power plants and electricity grids",
        "other2": "panels of experts on electricity prices",
        "far": "wolves hunt in packs",
    }
    qrels = Qrels({"q": {"pos": 1, "judged0": 0}})
    pairs = [Pair("solar panels sunlight electricity", "pos", "q")]
    with temporary_bm25(list(docs), list(docs.values())) as bm25:
        scores = {h.doc_id: h.score for h in bm25.search({"q": pairs[0].query}, 10)["q"]}
        assert scores["dup"] >= 0.95 * scores["pos"]  # the guard has work to do: a near-copy scores like the positive
        for seed in range(5):
            (negs,) = mine_bm25_negatives(pairs, bm25, qrels, 2, seed=seed)
            assert len(negs) == 2 and not {"pos", "dup", "judged0"} & set(negs), negs


def test_model_mining_draws_from_the_models_own_top_never_a_judged_or_near_duplicate_document(tiny_bi_encoder):
    import random

    from sentence_transformers import SentenceTransformer

    from retr.retrieval.types import Qrels
    from retr.train.data import Pair
    from retr.train.negatives import mine_model_negatives

    model = SentenceTransformer(str(tiny_bi_encoder), device="cpu")
    words = "solar wind rivers bread ovens dams wolves sea tides rain snow hills".split()
    docs = {f"d{i}": f"notes {i} on {w} and {words[(i + 3) % len(words)]}" for i, w in enumerate(words)}
    docs["copy"] = docs["d0"]  # the positive's very text under another id, unjudged
    qrels = Qrels({"q": {"d0": 1, "d1": 0}})  # d1 judged non-relevant: never a negative either
    pairs = [Pair("solar notes", "d0", "q")]
    ids, texts = list(docs), list(docs.values())
    emb = model.encode(texts, normalize_embeddings=True)
    score = dict(zip(ids, (emb @ model.encode([pairs[0].query], normalize_embeddings=True)[0]).tolist(), strict=True))
    ceiling = score["d0"] - 0.01 * abs(score["d0"])
    ranked = [d for d in sorted(ids, key=score.get, reverse=True) if d not in ("d0", "copy") and score[d] <= ceiling]
    assert "d1" in ranked[:8]  # the judged document is a candidate: the guard has work to do
    drawn: set[str] = set()
    for seed in range(8):
        random.seed(seed)
        (negs,) = mine_model_negatives(model, pairs, docs, ids, texts, qrels, 2, depth=8, relative_margin=0.01)
        assert len(negs) == 2 and not {"d0", "copy", "d1"} & set(negs), negs
        assert set(negs) <= set(ranked[:8])  # the model's own top, none within 1% of the positive's score
        drawn |= set(negs)
    assert len(drawn) > 2  # drawn at random within the top, not always the same two
    # a random model scores every text alike: within 5% of the positive, all but one of its top are left out, and a
    # pair short of negatives is dropped (None), never topped up
    assert mine_model_negatives(model, pairs, docs, ids, texts, qrels, 2, depth=8) == [None]


def test_dev_split_is_fixed_by_seed():
    from retr.retrieval.types import Qrels

    q = Qrels({f"q{i}": {"d": 1} for i in range(50)})
    assert split_dev(q, 0.2, 1) == split_dev(q, 0.2, 1)
    train, dev = split_dev(q, 0.2, 1)
    assert len(dev) == 10 and not set(train) & set(dev) and split_dev(q, 0.2, 2)[1] != dev


def test_self_supervised_pairs_never_pair_a_text_with_itself():
    from retr.retrieval.types import Document

    docs = [Document("a", "A title", "Body text that is long enough here."),
            Document("b", "", "First sentence is long enough. Second sentence is also long enough. Third one too!")]
    pairs, positives = self_supervised_pairs(docs, seed=0)
    assert [p.positive_id for p in pairs] == ["a", "b"]
    assert pairs[0].query == "A title"
    assert pairs[1].query not in positives["b"] and pairs[1].query in docs[1].text


def _cfg(base, **kw):
    return BiEncoderTrainConfig(base=str(base), epochs=kw.pop("epochs", 3), batch_size=4, mini_batch_size=2,
                                learning_rate=1e-3, max_length=32, num_negatives=1, negative_depth=5,
                                dev_fraction=0.3, dev_candidates=5, seed=0, **kw)


def test_tiny_training_run_learns_and_writes_a_loadable_folder(tiny_train, tiny_bi_encoder, tmp_path):
    from sentence_transformers import SentenceTransformer

    ds = load_dataset(str(tiny_train), "train", download=False)
    out = tmp_path / "bi"
    m = train_bi_encoder(out, _cfg(tiny_bi_encoder.parent / "bert", epochs=4), dataset=ds)
    assert len(m["loss_history"]) >= 2 and m["loss_history"][-1] < m["loss_history"][0]
    assert len(m["dev_ndcg@10_per_epoch"]) == 4 and m["dev_ndcg@10"] == max(m["dev_ndcg@10_per_epoch"])
    manifest = json.loads((out / "retr_manifest.json").read_text())
    assert manifest["config"]["seed"] == 0 and manifest["data_sha256"] == m["data_sha256"]
    assert manifest["precision"] == common.resolve_precision("auto")  # bf16 autocast where the CPU has it
    assert manifest["trainer_seconds"] > manifest["eval_seconds"] > 0  # the steps' time is told apart
    assert (out / "model.safetensors").is_file() and not list(out.glob("*.bin")) and not list(out.glob("*.pkl"))
    model = SentenceTransformer(str(out), device="cpu")
    assert model.encode(["solar"]).shape == (1, 32)
    assert not (tmp_path / ".bi.checkpoints").exists()


def test_resume_continues_from_the_last_checkpoint(tiny_train, tiny_bi_encoder, tmp_path):
    from transformers import TrainerCallback

    class Crash(TrainerCallback):
        def on_save(self, args, state, control, **kw):
            raise KeyboardInterrupt  # the session dies right after the first checkpoint

    ds = load_dataset(str(tiny_train), "train", download=False)
    out = tmp_path / "bi"
    with pytest.raises(KeyboardInterrupt):
        train_bi_encoder(out, _cfg(tiny_bi_encoder.parent / "bert", epochs=2), dataset=ds, callbacks=[Crash()])
    assert not out.exists() and list((tmp_path / ".bi.checkpoints").glob("checkpoint-*"))
    m = train_bi_encoder(out, _cfg(tiny_bi_encoder.parent / "bert", epochs=2), dataset=ds, resume=True)
    assert m["resumed_from"] and m["resumed_from"].endswith(f"checkpoint-{m['steps'] // 2}")
    assert (out / "retr_manifest.json").is_file()


@pytest.mark.parametrize(("distill", "inputs", "layers", "teacher"),
                         [(0.0, "head", 0, False), (0.5, "focused", 1, False), (0.7, "head", 1, True)])
def test_tiny_cross_encoder_training_writes_a_reranker(tiny_train, tiny_bi_encoder, tiny_cross_encoder, tmp_path,
                                                       distill, inputs, layers, teacher, caplog,
                                                       monkeypatch):
    from retr.retrieval.rerank import WEIGHT_RULE, CrossEncoderReranker, RerankConfig
    from retr.train.cross_encoder import CrossEncoderTrainConfig, smoothed_best, train_cross_encoder

    ds = load_dataset(str(tiny_train), "train", download=False)
    out = tmp_path / "ce"
    cfg = CrossEncoderTrainConfig(base=str(tiny_cross_encoder), first_stage_model=str(tiny_bi_encoder), epochs=2,
                                  batch_size=4, learning_rate=1e-3, max_length=32, num_negatives=2,
                                  negative_depth=8, dev_fraction=0.3, dev_depth=6, seed=0, distill=distill,
                                  inputs=inputs, layers=layers,
                                  teacher=str(tiny_cross_encoder) if teacher else None)
    if teacher:  # the lists' targets: the teacher's logits of exactly the lists trained on, mixed as configured
        import numpy as np

        import retr.train.teacher as teacher_module
        from retr.train.cross_encoder import mixed_target

        seen = {}
        real = teacher_module.teacher_logits

        def spy(path, queries, docs):
            seen["logits"] = real(path, queries, docs)
            seen["docs"] = docs
            return seen["logits"]

        monkeypatch.setattr(teacher_module, "teacher_logits", spy)
        from datasets import Dataset as HFDataset

        made = {}
        monkeypatch.setattr(HFDataset, "from_dict", classmethod(
            lambda cls, columns, _real=HFDataset.from_dict.__func__: made.setdefault("ds", _real(cls, columns))))
    m = train_cross_encoder(out, cfg, ds)
    if teacher:
        labels = np.asarray(made["ds"]["labels"])
        assert m["teacher"] == str(tiny_cross_encoder) and labels.shape == (m["train_lists"], 3)
        from retr.retrieval.models import hash_model_dir

        assert m["teacher_hash"] == hash_model_dir(tiny_cross_encoder)  # which teacher, by its files
        np.testing.assert_allclose(labels, [mixed_target(row, 0.7) for row in seen["logits"]], rtol=1e-6)
        assert all(len(d) == 3 for d in seen["docs"]) and len(seen["docs"]) == m["train_lists"]
    else:
        assert m["teacher"] is None and m["teacher_hash"] is None
    assert m["layers"] == (layers or 2) and json.loads((out / "config.json").read_text())["num_hidden_layers"] == m["layers"]
    assert m["config"]["distill"] == distill and m["inputs"] == inputs
    assert m["train_lists"] == len(labeled_pairs(ds.queries, ds.qrels, split_dev(ds.qrels, 0.3, 0)[0]))
    assert m["train_lists"] > 0 and len(m["dev_ndcg@10_per_epoch"]) == 2
    assert m["loss_history"] and 0 <= m["dev_ndcg@10_first_stage"] <= 1
    assert 0.0 <= m["interpolation"] <= 1.0 and len(m["dev_ndcg@10_by_interpolation"]) == 11
    assert f"{m['interpolation']:.1f}" == smoothed_best(m["dev_ndcg@10_by_interpolation"])
    assert m["interpolation_rule"] == WEIGHT_RULE  # models chosen by the raw dev peak before have none
    reranker = CrossEncoderReranker(RerankConfig(model=str(out)))  # passes the folder check
    assert reranker.interpolation == m["interpolation"]  # the dev choice travels with the model
    # so do the length it was trained at and what it reads of a document
    assert reranker.max_length == 32 and reranker.inputs == inputs and reranker.describe()["inputs"] == inputs
    long = "Tea leaves are dried. " * 8 + "Solar panels convert sunlight."
    assert (reranker.read("solar panels", [long]) == [long]) == (inputs == "head")
    assert reranker.score("solar panels", ["Solar panels convert sunlight", "Tea leaves"]).shape == (2,)
    # the corpus it was trained on travels with it: its own corpus keeps the dev weight; another, unchecked, gets a
    # warning once and the same weight
    assert reranker.trained_corpus == ds.corpus.sha256 and reranker.trained_on(ds.corpus.sha256) is True
    assert reranker.trained_on(None) is None and reranker.weight_for(ds.corpus.sha256, "m").source == "trained"
    with caplog.at_level("WARNING", logger="retr.retrieval.rerank"):
        assert reranker.trained_on("0" * 64) is False and reranker.needs_check("0" * 64)
        assert reranker.weight_for("0" * 64, "m") == reranker.weight_for("0" * 64, "m")
    warned = [r.getMessage() for r in caplog.records if "trained on another corpus" in r.getMessage()]
    assert len(warned) == 1 and "000000000000..." in warned[0] and ds.corpus.sha256[:12] in warned[0]
    assert reranker.weight_for("0" * 64, "m").source == "unchecked"


def test_distillation_targets_keep_the_positive_first_and_follow_the_first_stage():
    import numpy as np

    from retr.train.cross_encoder import CrossEncoderTrainConfig, distill_labels

    target = np.exp(distill_labels([0.2, 0.9, 0.5, 0.1], 0.4))  # ListNet's target: softmax of the labels
    assert target.sum() == pytest.approx(1.0)
    assert target[0] > 0.6  # the judged positive keeps 1 - weight, plus its own teacher share
    assert target[1] > target[2] > target[3]  # the negatives in the first stage's order
    flat = np.exp(distill_labels([0.3, 0.3, 0.3], 0.5))  # no spread: the teacher is uniform
    np.testing.assert_allclose(flat, [0.5 + 0.5 / 3, 0.5 / 3, 0.5 / 3])
    with pytest.raises(RetrError, match="--distill must be in"):
        CrossEncoderTrainConfig(distill=1.0)
    with pytest.raises(RetrError, match="--teacher needs --distill"):
        CrossEncoderTrainConfig(teacher="some-ce")


def test_a_teachers_target_is_its_softmax_mixed_with_the_judged_positive():
    import numpy as np

    from retr.train.cross_encoder import mixed_target

    logits = np.array([2.0, 3.0, -1.0])
    soft = np.exp(logits) / np.exp(logits).sum()
    np.testing.assert_allclose(np.exp(mixed_target(logits, 0.6)), 0.6 * soft + [0.4, 0, 0], rtol=1e-12)
    np.testing.assert_allclose(np.exp(mixed_target(logits + 500.0, 0.6)), np.exp(mixed_target(logits, 0.6)))


def test_teacher_loss_is_the_contrastive_loss_plus_kl_to_the_teacher(tiny_bi_encoder):
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    from retr.train.losses import TeacherMNRL

    model = SentenceTransformer(str(tiny_bi_encoder), device="cpu")
    cols = [["solar power", "tea leaves", "river dams"], ["Solar panels", "Green tea", "Hydro dams"],
            ["Bread dough", "Ovens", "Sea water"]]
    features = [model.tokenize(c) for c in cols]
    torch.manual_seed(0)
    plain = MultipleNegativesRankingLoss(model, scale=20.0)(features, None)
    with torch.no_grad():  # the student's own scores as the teacher: KL 0, the loss is the contrastive one
        q, pos, neg = (torch.nn.functional.normalize(model(f)["sentence_embedding"], dim=-1) for f in features)
        own = 20.0 * torch.stack([(q * pos).sum(-1), (q * neg).sum(-1)], dim=1)  # (B, 2)
    loss = TeacherMNRL(model, scale=20.0, weight=1.0)
    assert loss(features, own).item() == pytest.approx(plain.item(), abs=1e-5)
    other = own.flip(1) * 3  # a teacher that ranks every list the other way
    kl = torch.nn.functional.kl_div(torch.log_softmax(own, 1), torch.softmax(other, 1), reduction="batchmean")
    assert loss(features, other).item() == pytest.approx(plain.item() + kl.item(), rel=1e-4)
    assert TeacherMNRL(model, weight=0.0)(features, other).item() == pytest.approx(plain.item(), abs=1e-5)


def test_tiny_training_with_a_cross_encoder_teacher(tiny_train, tiny_bi_encoder, tiny_cross_encoder, tmp_path):
    from sentence_transformers.cross_encoder import CrossEncoder

    from retr.retrieval.backends.export import ce_logits
    from retr.train.data import labeled_pairs
    from retr.train.teacher import teacher_logits

    ds = load_dataset(str(tiny_train), "train", download=False)
    cfg = _cfg(tiny_bi_encoder.parent / "bert", epochs=2, teacher=str(tiny_cross_encoder))
    pairs = labeled_pairs(ds.queries, ds.qrels, sorted(ds.qrels))[:3]
    doc_text = {d.doc_id: d.full_text() for d in ds.corpus.docs}
    others = [d for d in doc_text if all(d != p.positive_id for p in pairs)]
    negatives = [others[i:i + 2] for i in range(len(pairs))]
    lists = [[doc_text[d] for d in (p.positive_id, *negs)] for p, negs in zip(pairs, negatives, strict=True)]
    labels = teacher_logits(cfg.teacher, [p.query for p in pairs], lists)
    ce = CrossEncoder(str(tiny_cross_encoder), num_labels=1, max_length=128, device="cpu")  # its 128 positions
    assert labels.shape == (3, 3)
    for p, negs, row in zip(pairs, negatives, labels, strict=True):  # its logits, list by list, positive first
        expected = ce_logits(ce, [(p.query, doc_text[d]) for d in (p.positive_id, *negs)])
        assert row == pytest.approx(expected.tolist(), rel=1e-4, abs=1e-5)
    # a teacher trained on focused documents at 16 tokens is scored reading them so
    import json
    import shutil

    from retr.retrieval.backends.batching import plain_tokenizer
    from retr.retrieval.focus import make_focus

    focused = tmp_path / "focused-teacher"
    shutil.copytree(tiny_cross_encoder, focused)
    (focused / "retr_manifest.json").write_text(json.dumps({"config": {"max_length": 16}, "inputs": "focused"}))
    long_text = {d: f"{t}. " + " ".join(f"Sentence {i} of {t}." for i in range(6)) for d, t in doc_text.items()}
    got = teacher_logits(str(focused), [p.query for p in pairs],
                         [[long_text[d] for d in (p.positive_id, *negs)] for p, negs in zip(pairs, negatives, strict=True)])
    ce16 = CrossEncoder(str(focused), num_labels=1, max_length=16, device="cpu")
    focus = make_focus(plain_tokenizer(focused), 16)
    for p, negs, row in zip(pairs, negatives, got, strict=True):
        read = focus.texts(p.query, [long_text[d] for d in (p.positive_id, *negs)])
        assert read != [long_text[d] for d in (p.positive_id, *negs)]
        assert row == pytest.approx(ce_logits(ce16, [(p.query, t) for t in read]).tolist(), rel=1e-4, abs=1e-5)
    from sentence_transformers import SentenceTransformer

    from retr.train.teacher import student_units

    student = SentenceTransformer(str(tiny_bi_encoder), device="cpu")
    factor = student_units(student, labels, pairs, negatives, doc_text, 20.0)
    assert factor > 0  # the teacher in the student's units: a teacher twice as spread gets half the factor
    assert student_units(student, labels * 2, pairs, negatives, doc_text, 20.0) == pytest.approx(factor / 2)
    assert student_units(student, labels, pairs, negatives, doc_text, 40.0) == pytest.approx(factor * 2)
    m = train_bi_encoder(tmp_path / "bi", cfg, dataset=ds)
    assert m["config"]["teacher"] == str(tiny_cross_encoder) and m["loss_history"] and m["teacher_factor"] > 0
    from retr.retrieval.models import hash_model_dir

    assert m["teacher"] == str(tiny_cross_encoder) and m["teacher_hash"] == hash_model_dir(tiny_cross_encoder)
    with pytest.raises(RetrError, match="--teacher needs"):
        BiEncoderTrainConfig(teacher=str(tiny_cross_encoder), num_negatives=0)


def test_one_turn_of_the_loop_mines_with_the_model_being_trained_and_distils_the_teacher(
        tiny_train, tiny_bi_encoder, tiny_cross_encoder, tmp_path, monkeypatch):
    from retr.train import negatives as mining

    seen = []
    real = mining.mine_model_negatives
    monkeypatch.setattr(mining, "mine_model_negatives", lambda model, *a, **kw: seen.append(model) or real(model, *a, **kw))
    ds = load_dataset(str(tiny_train), "train", download=False)
    first = train_bi_encoder(tmp_path / "bi0", _cfg(tiny_bi_encoder.parent / "bert", epochs=1), dataset=ds)
    assert first["config"]["negatives"] == "bm25" and not seen
    cfg = _cfg(tmp_path / "bi0", epochs=1, negatives="model", teacher=str(tiny_cross_encoder))
    m = train_bi_encoder(tmp_path / "bi1", cfg, dataset=ds)
    assert len(seen) == 1 and m["config"]["negatives"] == "model" and m["teacher_factor"] > 0
    # the miner was the model being trained: its start is the first turn's bi-encoder
    assert m["dev_ndcg@10_before"] == pytest.approx(first["dev_ndcg@10"], abs=1e-6)
    assert 0 < m["train_pairs"] <= first["train_pairs"]
    with pytest.raises(RetrError, match="--negatives"):
        BiEncoderTrainConfig(negatives="bm26")


def test_training_precision_resolves_auto_from_the_cpu(monkeypatch):

    monkeypatch.setenv("RETR_BF16", "1")  # this platform's bf16, forced
    assert common.resolve_precision("auto") == "bf16" and common.resolve_precision("fp32") == "fp32"
    monkeypatch.setenv("RETR_BF16", "0")
    assert common.resolve_precision("auto") == "fp32" and common.resolve_precision("bf16") == "bf16"
    with pytest.raises(RetrError, match="unknown precision 'fp8'"):
        common.resolve_precision("fp8")


def test_freezing_stops_gradients_at_the_first_trained_layer(tiny_bi_encoder, tiny_modernbert):
    from transformers import AutoModel

    for folder in (tiny_bi_encoder.parent / "bert", tiny_modernbert):
        model = AutoModel.from_pretrained(str(folder))
        embeddings, layers = common._backbone_layers(model)
        assert common.freeze_bottom(model, 0) == {"frozen_layers": 0}
        assert all(p.requires_grad for p in model.parameters())
        info = common.freeze_bottom(model, 1)
        assert not any(p.requires_grad for p in embeddings.parameters())
        assert not any(p.requires_grad for p in layers[0].parameters())
        assert all(p.requires_grad for layer in layers[1:] for p in layer.parameters())
        assert info["trainable_parameters"] == sum(p.numel() for p in model.parameters() if p.requires_grad) > 0
        with pytest.raises(RetrError, match=f"has {len(layers)} layers"):
            common.freeze_bottom(model, len(layers))


def test_keeping_the_bottom_layers_makes_a_smaller_model_that_computes_as_their_stack(tiny_bi_encoder,
                                                                                        tiny_modernbert, tmp_path):
    import torch
    from transformers import AutoModel, AutoTokenizer

    for folder in (tiny_bi_encoder.parent / "bert", tiny_modernbert):
        full, cut = AutoModel.from_pretrained(str(folder)), AutoModel.from_pretrained(str(folder))
        n = len(common._backbone_layers(full)[1])
        assert common.keep_bottom(cut, 0) == {"layers": n} and len(common._backbone_layers(cut)[1]) == n
        assert common.keep_bottom(cut, 1) == {"layers": 1, "layers_of_base": n}
        assert len(common._backbone_layers(cut)[1]) == 1 and cut.config.num_hidden_layers == 1
        cut.save_pretrained(tmp_path / folder.name)
        again = AutoModel.from_pretrained(str(tmp_path / folder.name))  # loads as a 1-layer model, nothing missing
        assert again.config.num_hidden_layers == 1 and len(common._backbone_layers(again)[1]) == 1
        batch = AutoTokenizer.from_pretrained(str(folder))(["solar panels make electricity"], return_tensors="pt")
        with torch.no_grad():  # the kept model computes what the full one computes after its first layer
            hidden = full(**batch, output_hidden_states=True).hidden_states[1]
            kept = again(**batch).last_hidden_state
            hidden = full.final_norm(hidden) if hasattr(full, "final_norm") else hidden  # ModernBERT's last norm
        assert torch.allclose(hidden, kept, atol=1e-5)
        with pytest.raises(RetrError, match=f"has only {n} layers"):
            common.keep_bottom(AutoModel.from_pretrained(str(folder)), n + 1)


def test_training_with_frozen_layers_leaves_them_as_they_were(tiny_train, tiny_bi_encoder, tiny_cross_encoder,
                                                             tmp_path):
    import torch
    from safetensors.torch import load_file

    from retr.train.cross_encoder import CrossEncoderTrainConfig, train_cross_encoder

    def tensors(folder):
        return {k.split("embeddings.", 1)[-1] if "embeddings." in k else k.split("layer.", 1)[-1]: v
                for k, v in load_file(str(folder / "model.safetensors")).items()
                if "embeddings." in k or "encoder.layer." in k}

    ds = load_dataset(str(tiny_train), "train", download=False)
    ce_cfg = CrossEncoderTrainConfig(base=str(tiny_cross_encoder), first_stage_model=str(tiny_bi_encoder), epochs=1,
                                     batch_size=4, learning_rate=1e-2, max_length=32, num_negatives=2,
                                     negative_depth=8, dev_fraction=0.3, dev_depth=6, seed=0, freeze_layers=1)
    runs = [(tiny_bi_encoder.parent / "bert", tmp_path / "bi",
             lambda out: train_bi_encoder(out, _cfg(tiny_bi_encoder.parent / "bert", epochs=1, freeze_layers=1),
                                          dataset=ds)),
            (tiny_cross_encoder, tmp_path / "ce", lambda out: train_cross_encoder(out, ce_cfg, ds))]
    for base, out, train in runs:
        m = train(out)
        assert m["frozen_layers"] == 1 and m["config"]["freeze_layers"] == 1
        before, after = tensors(base), tensors(out)
        assert set(before) == set(after) and before
        changed = {name for name, value in before.items() if not torch.equal(value, after[name])}
        assert changed and all(name.startswith("1.") for name in changed), changed  # layer 1 trained, no other


def test_cli_trains_with_frozen_layers_and_refuses_a_negative_count(tiny_train, tiny_bi_encoder, tmp_path, capsys):
    from retr.cli.main import main

    def argv(out, frozen):
        return ["train", "bi-encoder", "--dataset", str(tiny_train), "--base", str(tiny_bi_encoder.parent / "bert"),
                "--out", str(tmp_path / out), "--epochs", "1", "--batch-size", "4", "--max-length", "32",
                "--freeze-layers", frozen]

    assert main(argv("bi", "1")) == 0
    assert json.loads((tmp_path / "bi" / "retr_manifest.json").read_text())["frozen_layers"] == 1
    with pytest.raises(SystemExit) as e:
        main(argv("bi2", "-1"))
    assert e.value.code == 2 and "'-1' must be >= 0" in capsys.readouterr().err
    assert main(argv("bi2", "2")) == 2  # the tiny BERT has 2 layers: none would train
    assert "has 2 layers; leave at least one to train" in capsys.readouterr().err
    assert not (tmp_path / "bi2").exists()


def test_the_interpolation_weight_is_the_best_with_its_neighbours():
    from retr.train.cross_encoder import smoothed_best

    def curve(values):
        return {f"{i / 10:.1f}": v for i, v in enumerate(values)}

    # SciFact dev of a 1-epoch cross-encoder: the peak (0.5) sits one step before a cliff; its neighbours put 0.4 first
    ce1 = curve([0.7722, 0.7756, 0.7787, 0.7794, 0.7840, 0.7875, 0.7574, 0.7310, 0.6952, 0.6645, 0.6267])
    assert max(ce1, key=ce1.get) == "0.5" and smoothed_best(ce1) == "0.4"
    assert smoothed_best(curve([0.1, 0.2, 0.3, 0.9, 0.3, 0.2, 0.1, 0.0, 0.0, 0.0, 0.0])) == "0.3"  # a clear peak stays
    assert smoothed_best(curve([0.5] * 11)) == "0.0"  # flat: the smallest weight, the first stage alone
    assert smoothed_best(curve([0.0] * 10 + [1.0])) == "1.0"  # an end averages with its one neighbour
    # never a weight that measured below the first stage alone (0.0), however its neighbours average: CISI's
    # pseudo-queries for the default SciFact cross-encoder averaged to 0.1, which lost there (README)
    cisi = curve([0.3245, 0.3203, 0.3229, 0.3169, 0.3115, 0.2986, 0.2873, 0.2673, 0.2467, 0.2203, 0.2028])
    assert smoothed_best(cisi) == "0.0"
    assert smoothed_best(curve([0.5, 0.49, 0.6, 0.4, 0.3, 0.2, 0.1, 0.0, 0.0, 0.0, 0.0])) == "0.2"


def test_dropout_overrides_name_each_architectures_entries(tiny_bi_encoder, tiny_modernbert, tmp_path):
    from retr.train.cross_encoder import CrossEncoderTrainConfig

    bert = tiny_bi_encoder.parent / "bert"
    assert common.dropout_overrides(bert, TrainConfig()) == {}  # nothing asked: the base's own dropout
    assert common.dropout_overrides(bert, TrainConfig(attention_dropout=0.0)) == {"attention_probs_dropout_prob": 0.0}
    assert common.dropout_overrides(bert, CrossEncoderTrainConfig(attention_dropout=0.0, hidden_dropout=0.05)) == {
        "attention_probs_dropout_prob": 0.0, "hidden_dropout_prob": 0.05}  # classifier_dropout is a head's: kept
    modern = json.loads((tiny_modernbert / "config.json").read_text())
    assert {"attention_dropout", "mlp_dropout", "embedding_dropout", "classifier_dropout"} <= set(modern)
    assert common.dropout_overrides(tiny_modernbert, TrainConfig(attention_dropout=0.0, hidden_dropout=0.0)) == {
        "attention_dropout": 0.0, "mlp_dropout": 0.0, "embedding_dropout": 0.0}
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_dropout_prob": 0.1}))
    with pytest.raises(RetrError, match=r"config.json: no attention dropout entry"):
        common.dropout_overrides(tmp_path, TrainConfig(attention_dropout=0.0))
    with pytest.raises(RetrError, match=r"cannot read the backbone's config"):
        common.dropout_overrides(tmp_path / "missing", TrainConfig(hidden_dropout=0.0))
    for bad in (-0.1, 1.0):
        with pytest.raises(RetrError, match="--attention-dropout must be in"):
            BiEncoderTrainConfig(attention_dropout=bad)


def test_bf16_training_takes_the_fused_attention_unless_attention_dropout_is_on(tiny_bi_encoder, tiny_modernbert,
                                                                               tmp_path):
    """Eager attention only where bf16 would otherwise leave SDPA's fused kernel (attention probabilities dropped
    out); the dropout read from the overrides first, then from the base's config, BERT's 0.1 when unreadable."""
    bert = tiny_bi_encoder.parent / "bert"
    eager = {"attn_implementation": "eager"}
    assert common.model_kwargs("fp32", bert, {}) is None
    assert common.model_kwargs("bf16", bert, {}) == eager  # the base's own 0.1
    assert common.model_kwargs("bf16", bert, common.dropout_overrides(bert, TrainConfig(attention_dropout=0.0))) is None
    assert common.model_kwargs("bf16", bert, {"hidden_dropout_prob": 0.0}) == eager
    no_dropout = common.dropout_overrides(tiny_modernbert, TrainConfig(attention_dropout=0.0))
    assert common.model_kwargs("bf16", tiny_modernbert, no_dropout) is None
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "attention_probs_dropout_prob": 0.0}))
    assert common.model_kwargs("bf16", tmp_path, {}) is None  # a base trained without it keeps training without it
    assert common.model_kwargs("bf16", tmp_path / "missing", {}) == eager
    # what the trainers load with: both together, the bi-encoder's default (no attention dropout) on SDPA
    assert common.transformer_kwargs(bert, BiEncoderTrainConfig(), "bf16") == {
        "model_kwargs": None, "config_kwargs": {"attention_probs_dropout_prob": 0.0}}


def test_training_without_attention_dropout_writes_it_into_the_model(tiny_train, tiny_bi_encoder, tiny_cross_encoder,
                                                                   tmp_path):
    """The override reaches the module the trainer steps (what the saved config says it was built with), for both
    trainers, and the manifest records it; the base's other dropout is left as it was."""
    from retr.cli.main import main

    runs = {"bi-encoder": ["--base", str(tiny_bi_encoder.parent / "bert")],
            "cross-encoder": ["--base", str(tiny_cross_encoder), "--first-stage-model", str(tiny_bi_encoder),
                              "--num-negatives", "2"]}
    for trainer, extra in runs.items():
        out = tmp_path / trainer
        assert main(["train", trainer, "--dataset", str(tiny_train), "--out", str(out), "--epochs", "1",
                     "--batch-size", "4", "--max-length", "32", "--max-steps", "2", "--attention-dropout", "0",
                     *extra]) == 0
        saved = json.loads((out / "config.json").read_text())
        assert saved["attention_probs_dropout_prob"] == 0.0 and saved["hidden_dropout_prob"] == 0.1, trainer
        config = json.loads((out / "retr_manifest.json").read_text())["config"]
        assert config["attention_dropout"] == 0.0 and config["hidden_dropout"] is None, trainer


# --- progress: a bar on a terminal, a line per epoch elsewhere, none of the libraries' own prints ---------------

_EPOCH_LINE = r"\[retr\] INFO epoch {n}/2, loss \d+\.\d{{4}}, {metric} \d+\.\d{{4}} \(step \d+/\d+, \d+:\d\d, \d+:\d\d left\)"
_LIBRARY_PRINTS = ("{'loss'", "'eval_", "{'train_runtime'", "Computing widget examples", "Map:", "examples/s",
                   "Writing model shards")


def _no_library_prints(*outputs: str) -> None:
    for text in outputs:
        for raw in _LIBRARY_PRINTS:
            assert raw not in text, (raw, text)


def test_training_off_a_terminal_logs_one_line_per_epoch_and_no_library_prints(tiny_train, tiny_bi_encoder,
                                                                               tmp_path, capsys):
    import re

    from retr.cli.main import main

    assert main(["train", "bi-encoder", "--dataset", str(tiny_train), "--base", str(tiny_bi_encoder.parent / "bert"),
                 "--out", str(tmp_path / "bi"), "--epochs", "2", "--batch-size", "4", "--max-length", "32"]) == 0
    out, err = capsys.readouterr()
    _no_library_prints(out, err)
    assert out.count("\n") == 1 and out.startswith("bi-encoder written to")  # stdout: the result alone
    assert "\r" not in err and "step/s" not in err  # no bar where there is no terminal
    assert re.search(r"\[retr\] INFO before training: dev nDCG@10 \d\.\d{4}\n", err)
    for n in (1, 2):
        assert len(re.findall(_EPOCH_LINE.format(n=n, metric="dev nDCG@10"), err)) == 1, err
    assert len(re.findall(r"INFO epoch \d", err)) == 2 and "dev nDCG@10 1.0000 (epoch" not in err
    losses = [float(v) for v in re.findall(r"epoch \d/2, loss (\d+\.\d+)", err)]
    manifest = json.loads((tmp_path / "bi" / "retr_manifest.json").read_text())
    # each epoch line's loss is the mean of the losses the trainer logged in that epoch (one per step here)
    per_step = manifest["loss_history"]
    assert len(per_step) == manifest["steps"] == 8
    assert losses == pytest.approx([sum(per_step[:4]) / 4, sum(per_step[4:]) / 4], abs=1e-4)


class _FakeTerminal:
    """A stderr that says it is a terminal and keeps what is written to it."""

    def __init__(self):
        import io

        self.buffer = io.StringIO()

    def isatty(self) -> bool:
        return True

    def write(self, s: str) -> int:
        return self.buffer.write(s)

    def flush(self) -> None:
        pass


def test_training_on_a_terminal_draws_a_step_bar_with_the_loss_and_restores_the_libraries(tiny_dataset,
                                                                                         tiny_bi_encoder, tmp_path,
                                                                                         capsys, monkeypatch):
    import re
    import sys

    from transformers.utils import logging as hf_logging

    from retr.cli.main import main

    hf_bars = hf_logging.is_progress_bar_enabled()
    terminal = _FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["train", "mlm", "--corpus", str(tiny_dataset), "--base", str(tiny_bi_encoder.parent / "bert"),
                 "--out", str(tmp_path / "mlm"), "--epochs", "2", "--batch-size", "4", "--max-length", "32"]) == 0
    monkeypatch.undo()
    shown = terminal.buffer.getvalue()
    out, err = capsys.readouterr()
    _no_library_prints(shown, out, err)
    # the bar: steps counted to the end, with its rate, ETA and the running loss
    frames = shown.split("\r")
    assert any(re.search(r"training: +100%\|.*\| 8/8 \[\d\d:\d\d<00:00, .*loss=\d+\.\d{4}", f) for f in frames), shown
    assert any(re.search(r"training: +\d+%\|.*\| [1-7]/8 \[\d\d:\d\d<\d\d:\d\d", f) for f in frames), shown
    assert "dev MLM loss=" in shown  # the last evaluation beside it
    # the log lines are written above the bar (which is cleared first: a carriage return), each whole on its line
    assert re.search(r"\[retr\] INFO before training: dev MLM loss \d+\.\d{4}\n", shown)
    for n in (1, 2):
        assert re.search(r"[\r\n]" + _EPOCH_LINE.format(n=n, metric="dev MLM loss") + "\n", shown), shown
    # the libraries' bars are as they were once training is over
    assert hf_logging.is_progress_bar_enabled() == hf_bars
    import sentence_transformers.base.model_card as card
    from tqdm.autonotebook import tqdm

    assert card.tqdm is tqdm


def test_training_without_the_train_extra_says_what_to_install(tiny_train, tiny_bi_encoder, tmp_path, capsys,
                                                               monkeypatch):
    import importlib.util

    from retr.cli.main import main
    from retr.train.bi_encoder import train_bi_encoder

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "datasets" else real(name, *a))
    assert main(["train", "bi-encoder", "--dataset", str(tiny_train), "--out", str(tmp_path / "bi")]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == ("retr: error: training needs datasets, which is not installed: "
                                            "pip install 'retr[train]' (from a source checkout: "
                                            "pip install -e '.[train]')")
    assert "fields used" not in err and not (tmp_path / "bi").exists()  # refused before the data was read
    with pytest.raises(RetrError, match=r"pip install 'retr\[train\]'"):  # the Python API refuses alike
        train_bi_encoder(tmp_path / "bi", _cfg(tiny_bi_encoder.parent / "bert"),
                         dataset=load_dataset(str(tiny_train), "train", download=False))


def test_training_a_cross_encoder_makes_this_machines_graphs_and_stores_which_one_reranks(
        tiny_train, tiny_bi_encoder, tiny_cross_encoder, tmp_path, capsys, monkeypatch):
    """After training, `retr train cross-encoder` makes every cross-encoder graph this machine can run and stores
    the measured choice among them, so that the first search with the new model times nothing; ``--no-graphs``
    makes none (a search then finds the configured graph alone)."""
    import retr.cli.doctor_rerank as doctor_rerank
    from retr.cli.main import main
    from retr.retrieval.backends.registry import DEFAULT_RERANK_BACKEND
    from retr.retrieval.rerank_graphs import PairGraphs
    from retr.retrieval.rerank_model import DEFAULT_RERANK_DEPTH, CrossEncoderReranker, RerankConfig

    def train(out: str, *extra: str) -> str:
        assert main(["train", "cross-encoder", "--dataset", str(tiny_train), "--base", str(tiny_cross_encoder),
                     "--first-stage-model", str(tiny_bi_encoder), "--out", str(tmp_path / out), "--epochs", "1",
                     "--batch-size", "4", "--max-length", "32", "--max-steps", "2", "--num-negatives", "2",
                     *extra]) == 0
        return capsys.readouterr().out

    def search_side(out: str) -> CrossEncoderReranker:
        return CrossEncoderReranker(RerankConfig(model=str(tmp_path / out), depth=DEFAULT_RERANK_DEPTH,
                                                 corpus_check=False))

    timed, results = [], {}
    real_seconds, real_make = PairGraphs.seconds, doctor_rerank.make_graphs
    monkeypatch.setattr(PairGraphs, "seconds", lambda self, graph: timed.append(graph.variant)
                        or real_seconds(self, graph))
    monkeypatch.setattr(doctor_rerank, "make_graphs", lambda *a: results.setdefault("graphs", real_make(*a)))

    assert "graphs made" not in train("plain", "--no-graphs") and not results and not timed
    plain = search_side("plain")
    assert set(plain.pair_graphs.candidates) == {DEFAULT_RERANK_BACKEND} and plain.choice is None and not timed

    printed = train("made")
    made, refused = results["graphs"]
    # every graph this machine can run was made or refused with a reason, and each made one was timed
    assert set(made) | set(refused) == {b.name for b in doctor_rerank.candidates()[0]}
    assert len(made) > 1 and DEFAULT_RERANK_BACKEND in made and sorted(timed) == sorted(made), (timed, made)
    assert all(refused.values())
    timed.clear()
    reranker = search_side("made")
    assert set(reranker.pair_graphs.candidates) == set(made)
    assert reranker.choice is not None and not reranker.choice.measured and not timed  # read back, not timed
    assert reranker.backend == reranker.choice.backend and f"reranking takes {reranker.backend}: " in printed
    # the candidates the stored choice did not take were never opened: no session, no compiled model
    others = [g.runner for name, g in reranker.pair_graphs.candidates.items() if name != reranker.backend]
    held = [r for r in others if getattr(r, "_compiled", None) is not None or getattr(r, "_session", None) is not None
            or "session" in vars(r)]  # (an eagerly opened session would be an attribute of its own)
    assert any(type(r).__name__ == "OrtRunner" for r in others) and not held


def test_self_supervised_training_on_too_few_usable_documents_says_what_makes_a_pair(tmp_path, capsys):
    from retr.cli.main import main

    corpus = tmp_path / "notes.jsonl"
    corpus.write_text('{"id": "n0", "text": "Rotate the API keys every 90 days from the admin console."}\n'
                      '{"id": "n1", "text": "Backups run nightly and are kept for 30 days."}\n')
    assert main(["train", "bi-encoder", "--corpus", str(corpus), "--self-supervised",
                 "--out", str(tmp_path / "bi")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("retr: error: too little training data: 0 pairs, 0 dev queries from 2 documents: ")
    assert "title and body" in err and not (tmp_path / "bi").exists()
