"""Hub ids wherever a model is named: a tiny bi-encoder and a tiny cross-encoder laid out in the Hugging Face hub
cache's layout under a temporary HF_HOME resolve by id, with the identity (content hash) of their folders, and a
hub id that is not cached is the same one-line error for every kind of model (offline)."""

from __future__ import annotations

import shutil

import pytest

from retr.retrieval.errors import RetrError

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _cache(hf_home, repo_id: str, folder) -> None:
    """``folder`` as the hub cache holds a download of ``repo_id``: blobs behind a snapshot, refs/main."""
    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    shutil.copytree(folder, snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)


@pytest.fixture()
def hub(tmp_path, monkeypatch, tiny_bi_encoder, tiny_cross_encoder):
    import huggingface_hub.constants as constants

    home = tmp_path / "hf"
    _cache(home, "retr-test/tiny-bi", tiny_bi_encoder)
    _cache(home, "retr-test/tiny-ce", tiny_cross_encoder)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))  # read once at import: point it here too
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return home


def test_hub_ids_resolve_through_the_local_cache(hub, tiny_bi_encoder, tiny_cross_encoder):
    from retr.retrieval.models import ModelRef
    from retr.retrieval.rerank import CrossEncoderReranker, RerankConfig

    bi = ModelRef.resolve("retr-test/tiny-bi")
    assert bi.id == "retr-test/tiny-bi" and bi.path.is_relative_to(hub)
    assert bi.hash == ModelRef.resolve(str(tiny_bi_encoder)).hash  # the same identity as the folder
    ce = CrossEncoderReranker(RerankConfig(model="retr-test/tiny-ce", corpus_check=False))
    assert ce.path.is_relative_to(hub) and ce.ref.hash == ModelRef.resolve(str(tiny_cross_encoder)).hash
    folder = CrossEncoderReranker(RerankConfig(model=str(tiny_cross_encoder), corpus_check=False))
    texts = ["solar panels make electricity", "cats are pets"]
    assert list(ce.score("solar power", texts)) == list(folder.score("solar power", texts))


def test_search_reranks_with_a_hub_id(hub, tmp_path, tiny_dataset, capsys):
    from retr.cli.main import main

    index = tmp_path / "idx"
    assert main(["index", "--corpus", str(tiny_dataset), "--out", str(index), "--model", "retr-test/tiny-bi"]) == 0
    capsys.readouterr()
    assert main(["search", str(index), "solar electricity", "--mode", "bm25", "--rerank", "retr-test/tiny-ce",
                 "--no-rerank-check", "-k", "3", "--json"]) == 0
    import json

    hits = json.loads(capsys.readouterr().out)["results"]
    assert len(hits) == 3


def test_a_hub_id_not_cached_is_one_clear_error(hub):
    from retr.retrieval.models import ModelRef
    from retr.retrieval.rerank import CrossEncoderReranker, RerankConfig

    with pytest.raises(RetrError, match="'retr-test/absent': no such folder, and not in the hub cache"):
        ModelRef.resolve("retr-test/absent")
    with pytest.raises(RetrError, match="'retr-test/absent': no such folder, and not in the hub cache"):
        CrossEncoderReranker(RerankConfig(model="retr-test/absent"))
    with pytest.raises(RetrError, match="not a cross-encoder"):  # a bi-encoder named as a cross-encoder
        CrossEncoderReranker(RerankConfig(model="retr-test/tiny-bi"))


def test_a_mistyped_model_name_gets_the_near_name_it_may_mean(hub):
    from retr.retrieval.models import ModelRef

    for typed, meant in [("all-MiniLM-L6-V3", "all-MiniLM-L6-v2"), ("retr-test/tiny-bj", "retr-test/tiny-bi"),
                         ("Tiny-Bi", "tiny-bi")]:
        with pytest.raises(RetrError, match=f"'{typed}': no such folder.* did you mean '{meant}'\\? Else download"):
            ModelRef.resolve(typed)
    with pytest.raises(RetrError) as e:
        ModelRef.resolve("retr-test/absent")
    assert "did you mean" not in str(e.value)
