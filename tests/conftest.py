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
# cluster, injects faults (tests/reliability), or builds, quantises and times graphs for seconds: whole modules
# below, and the tests of other modules measured at 1.5 s or more (setup included) in a whole-suite run on a quiet
# 2-core AVX2 EPYC (2026-12-07, 1,138 s in all). The fast tier, `python -m pytest -m "not slow"`, is what a
# contributor runs while working; CI runs every tier.
SLOW_MODULES = frozenset({"test_browser", "test_ray", "test_regress"})
SLOW_TESTS: dict[str, set[str]] = {
    "test_api": {"test_the_library_prints_nothing_and_raises_retr_errors", "test_the_readme_example_runs"},
    "test_batch": {"test_batch_search_equals_single_searches", "test_batch_search_with_filter_and_every_format",
        "test_batch_search_with_rerank", "test_from_documents_strings_dicts_and_out",
        "test_topics_to_run_to_eval_run_equals_eval_dataset"},
    "test_check_reranker": {"test_search_reads_the_check_that_check_reranker_stores"},
    "test_cli": {"test_eval_end_to_end_on_adi_matches_beir_and_reuses_cache",
        "test_eval_with_rerank_pipeline_on_tiny_dataset", "test_index_and_search_a_users_jsonl_with_paths_only",
        "test_search_modes_and_rerank_with_tiny_models",
        "test_sigterm_stops_retr_index_and_removes_its_building_folder_as_ctrl_c_does"},
    "test_compare": {"test_eval_over_two_datasets_then_compare"},
    "test_compiled": {"test_a_cache_that_cannot_be_written_still_compiles_and_searches",
        "test_a_damaged_kept_model_is_discarded_with_a_warning_and_compiled_again",
        "test_a_kept_model_stays_only_where_reading_it_back_was_measured_faster_than_compiling",
        "test_the_query_graph_is_kept_compiled_and_read_back_checked_by_the_next_process",
        "test_writing_a_kept_model_removes_those_it_supersedes_and_what_openvinos_cache_left"},
    "test_conformance": {"test_retriever_conformance"},
    "test_direct": {"test_a_static_int8_graph_is_calibrated_from_the_built_graph_without_torch",
        "test_the_int8_benchmark_measures_every_graph_against_the_torch_model"},
    "test_docs": {"test_the_site_builds_strict"},
    "test_doctor": {"test_doctor_leads_with_a_plain_summary_and_keeps_the_detail_for_verbose",
        "test_doctor_prints_the_cpu_the_candidates_the_choice_and_the_first_run_cost",
        "test_doctor_says_where_the_base_graphs_speed_is_estimated_from_the_probe_not_timed",
        "test_doctor_shows_each_query_candidates_ranking_noise_beside_its_speed",
        "test_doctor_shows_the_int8_weights_graph_a_corpus_too_small_for_a_calibration_takes",
        "test_doctor_times_a_cross_encoders_graphs_at_the_rerank_depth",
        "test_doctor_times_the_documents_graphs_as_the_index_will_and_stores_it"},
    "test_eval_index": {"test_eval_index_after_add_and_delete",
        "test_eval_index_gives_the_report_of_eval_dataset"},
    "test_filters": {"test_filtered_search_equals_the_unfiltered_ranking_restricted"},
    "test_generations": {"test_a_crash_at_each_publishing_step_leaves_the_old_or_the_new_index",
        "test_a_folder_lost_between_the_two_renames_of_an_older_swap_is_recovered",
        "test_a_rebuild_over_an_open_index_never_pulls_parts_from_under_its_reader",
        "test_a_sharded_index_and_its_rebuild_keep_working",
        "test_an_open_reader_keeps_its_generation_while_another_writer_changes_the_folder",
        "test_the_opened_generation_is_exposed_and_is_the_manifests"},
    "test_hub_models": {"test_search_reranks_with_a_hub_id"},
    "test_irds": {"test_eval_irds_gives_the_report_of_the_beir_folder"},
    "test_manifest_trust": {"test_a_hostile_model_folder_is_one_line_and_never_hangs",
        "test_a_manifest_path_outside_the_folder_is_refused",
        "test_add_uses_the_id_and_title_fields_the_index_was_built_with",
        "test_hashing_never_opens_a_special_file"},
    "test_mlm": {"test_a_run_killed_at_a_checkpoint_and_resumed_ends_as_the_uninterrupted_one",
        "test_tiny_mlm_run_adds_a_tied_head_and_writes_a_bert_folder",
        "test_tiny_run_with_packing_records_it_and_keeps_a_cls_head"},
    "test_modernbert": {"test_bi_encoder_exports_checked_indexes_and_searches",
        "test_cross_encoder_from_modernbert", "test_mlm_follows_modernberts_recipe"},
    "test_onnx": {"test_a_cached_calibration_with_its_speeds_stored_names_a_corpus_graph_without_tokenising_it",
        "test_a_calibration_that_pays_once_weighing_the_int8_weights_graph_is_counted_never_makes_that_graph",
        "test_a_corpus_encoded_through_static_int8_keeps_its_speed_and_a_later_corpus_times_neither_graph",
        "test_a_corpus_too_small_for_a_calibration_goes_through_the_int8_weights_graph_where_measured_faster",
        "test_a_first_run_on_an_empty_home_starts_no_vendor_telemetry_and_prints_each_line_once",
        "test_a_graph_that_ignores_padding_is_refused_and_the_refusal_remembered",
        "test_a_refused_corpus_graph_falls_back_to_the_openvino_graph_once",
        "test_a_refused_int8_weights_graph_leaves_small_corpora_to_the_base_graph",
        "test_a_refused_query_graph_falls_back_to_the_document_graph",
        "test_a_static_int8_graph_built_from_the_weights_reads_its_statistics_pass_vectors_in_its_checks",
        "test_a_static_int8_graphs_checks_read_the_vectors_its_statistics_pass_computed",
        "test_an_export_torchscript_cannot_make_comes_from_dynamo_and_older_exports_are_redone",
        "test_an_int8_graphs_checks_read_the_sample_vectors_the_planner_timed_the_base_graph_on",
        "test_an_int8_weights_graph_checked_on_its_base_graph_scores_as_against_a_reference_built_again",
        "test_an_int8_weights_graph_is_made_only_where_it_could_repay_making_and_timing_it",
        "test_concurrent_single_calls_run_on_their_own_requests_and_agree",
        "test_corpora_go_through_one_static_int8_graph_calibrated_once_per_model",
        "test_cross_encoder_graph_scores_like_torch",
        "test_documents_added_after_the_int8_graph_was_refused_take_the_base_graph",
        "test_graphs_are_exported_with_eager_attention_and_compute_what_sdpas_export_does",
        "test_int8_that_adds_ranking_noise_is_refused_until_the_bar_changes",
        "test_queries_share_the_document_graph_unless_another_query_backend_is_chosen",
        "test_static_int8_cross_encoder_is_calibrated_on_pairs_and_checked_for_ranking_noise",
        "test_the_base_graph_is_not_timed_where_its_speed_from_the_precision_probe_clears_the_break_even_widely",
        "test_the_base_graphs_compiled_streams_are_dropped_before_a_calibration_and_not_compiled_for_its_checks",
        "test_the_base_graphs_timing_is_warmed_up_on_a_few_short_passages_not_a_whole_round",
        "test_the_feed_forward_int8_backend_quantises_only_the_feed_forward_matmuls",
        "test_where_no_corpus_could_pay_for_a_calibration_its_graph_is_named_without_counting_tokens",
        "test_without_int8_dot_products_corpora_and_pairs_take_the_base_graph_and_nothing_is_calibrated"},
    "test_passages": {"test_cli_passages_eval_report_and_refusals",
        "test_eval_reports_truncation_and_scores_documents_over_passages",
        "test_every_kind_and_mode_fills_k_documents_and_filters_hold"},
    "test_pipeline": {"test_eval_search_api_and_serve_give_the_same_hits_for_one_expression"},
    "test_platform": {"test_a_query_candidate_not_taken_holds_no_session_once_the_choice_is_made",
        "test_a_query_graph_beyond_the_ranking_noise_bar_is_never_picked_however_fast",
        "test_queries_take_the_measured_fastest_cached_graph_and_the_choice_is_stored",
        "test_the_models_static_int8_graph_is_a_query_candidate_once_calibrated_as_one_stream",
        "test_where_int8_is_assumed_no_faster_nothing_is_timed_until_the_int8_graph_exists",
        "test_where_queries_go_through_another_compiled_graph_the_documents_one_is_dropped_until_needed",
        "test_with_the_int8_graph_made_a_later_corpus_reads_the_stored_per_token_speeds"},
    "test_progress": {"test_index_piped_to_a_file_logs_progress_lines_with_count_and_rate"},
    "test_prompts": {"test_prompts_are_recorded_and_checked_on_search"},
    "test_report": {"test_report_page_holds_the_table_and_every_figure"},
    "test_request": {"test_a_requests_fusion_and_aggregate_are_those_of_an_index_opened_with_them",
        "test_any_request_value_is_a_request_or_a_retr_error"},
    "test_rerank_check": {"test_a_corpus_too_short_to_check_keeps_the_trained_weight",
        "test_eval_checks_a_reranker_from_another_corpus_and_caps_its_weight",
        "test_serve_checks_its_reranker_at_startup",
        "test_the_check_step_measures_a_reranker_on_the_index_once_and_searches_read_it"},
    "test_rerank_choice": {"test_a_candidate_over_the_noise_bound_is_never_chosen",
        "test_a_graph_made_apart_is_made_in_a_child_into_the_cache_and_its_refusal_raised_here",
        "test_a_run_whose_queries_repay_it_makes_the_static_int8_graph_and_chooses_again",
        "test_a_static_int8_graph_refused_when_made_leaves_the_base_graph_and_is_never_weighed_again",
        "test_real_timing_and_noise_of_two_graphs",
        "test_the_fastest_cached_graph_that_passes_is_chosen_then_read_back"},
    "test_rerank_stored": {"test_a_reopened_searcher_takes_the_check_stored_for_its_new_corpus",
        "test_a_stored_check_survives_new_generations_and_is_not_used_for_their_corpus",
        "test_check_reranker_stores_beside_the_index_and_a_symlinked_folder_is_not_followed",
        "test_eval_index_stores_the_check_it_runs_beside_the_index_and_reads_it_there_next",
        "test_index_rerank_stores_the_check_beside_the_index_and_a_copy_keeps_it",
        "test_serve_stores_the_check_it_runs_beside_the_index_and_reads_it_there_next"},
    "test_serve": {"test_a_rebuilt_index_is_picked_up_as_a_new_generation",
        "test_a_streamed_body_over_the_bound_gets_413",
        "test_added_and_deleted_documents_are_served_as_a_new_generation",
        "test_bad_requests_get_a_4xx_with_a_json_error",
        "test_concurrent_requests_share_one_index_without_errors", "test_malformed_and_oversized_bodies",
        "test_served_searches_take_the_loop_for_one_client_and_the_pool_under_load",
        "test_the_service_and_the_cli_agree_on_a_fusion_depth"},
    "test_serve_safety": {"test_500_stalled_clients_hold_bounded_descriptors_and_memory_freed_by_the_timeout",
        "test_a_damaged_generation_is_refused_and_the_last_good_one_served",
        "test_a_slow_client_is_answered_408_and_others_are_served_meanwhile",
        "test_any_search_body_gets_a_2xx_or_a_4xx",
        "test_healthz_reports_the_manifests_generation_not_the_servers_count"},
    "test_shards": {"test_cli_eval_and_refusals", "test_partition_is_stable_and_complete"},
    "test_multivector": {"test_cli_eval_reports_the_maxsim_stage",
                         "test_train_multi_vector_writes_a_folder_the_maxsim_stage_takes",
                         "test_token_vectors_are_kept_reused_and_rebuilt_when_damaged"},
    "test_sparse": {"test_a_tampered_sparse_part_is_refused", "test_add_and_delete_equal_a_fresh_build",
        "test_an_unrecorded_file_in_the_sparse_part_is_refused",
        "test_api_and_service_search_the_sparse_part_as_the_pipeline_does", "test_cli_eval_three_way",
        "test_index_round_trip", "test_three_way_fusion_fuses_the_three_runs",
        "test_train_sparse_encoder_writes_a_folder_the_index_takes"},
    "test_topics": {"test_eval_run_scores_as_eval_dataset_does"},
    "test_train": {"test_resume_continues_from_the_last_checkpoint",
        "test_tiny_cross_encoder_training_writes_a_reranker",
        "test_tiny_training_run_learns_and_writes_a_loadable_folder",
        "test_tiny_training_with_a_cross_encoder_teacher",
        "test_training_a_cross_encoder_makes_this_machines_graphs_and_stores_which_one_reranks",
        "test_training_off_a_terminal_logs_one_line_per_epoch_and_no_library_prints",
        "test_training_with_frozen_layers_leaves_them_as_they_were",
        "test_training_without_attention_dropout_writes_it_into_the_model"},
    "test_trust": {"test_a_graph_manifest_that_is_no_file_or_lies_is_discarded_and_the_graph_made_again",
        "test_two_models_under_a_cache_path_never_share_an_identity"},
    "test_trust3": {"test_a_doc_store_cut_short_between_its_check_and_its_read_is_one_line_not_sigbus",
                    "test_a_copied_cache_reads_its_compiled_query_graph_back_without_compiling",
        "test_a_document_whose_id_holds_a_newline_is_fetched_over_http_and_errors_keep_their_shape",
        "test_a_reader_killed_with_kill_9_frees_its_generation_for_the_next_writer",
        "test_documents_without_any_bm25_term_are_one_line_from_the_api_and_the_cli"},
    "test_update": {"test_bad_changes_are_refused_and_leave_the_index_as_it_was",
        "test_filters_see_the_changed_documents", "test_generations_tombstones_and_compact",
        "test_search_after_add_and_delete_equals_a_fresh_build", "test_the_api_changes_an_open_index"},
    "test_workflow_probe": {"test_a_run_file_and_a_report_scored_against_the_same_judgements_are_compared"},
}
# `cpu`: tests whose outcome may follow the host's instructions (graphs built, quantised, compiled and chosen).
# CI runs them a second time as an AVX2-only CPU would (`ONEDNN_MAX_CPU_ISA=AVX2 python -m pytest -m cpu`).
CPU_MODULES = frozenset({"test_onnx", "test_quantize", "test_rerank_choice", "test_platform", "test_doctor",
                         "test_direct", "test_compiled", "test_modernbert"})


def _tier_of(item) -> tuple[bool, bool]:
    module = item.path.stem
    name = item.nodeid.split("::", 1)[-1].split("[", 1)[0]
    slow = "reliability" in item.path.parts or module in SLOW_MODULES or name in SLOW_TESTS.get(module, ())
    return slow, module in CPU_MODULES


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
