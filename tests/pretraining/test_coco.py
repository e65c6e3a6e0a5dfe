from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch
from helpers import coco_args, grads_after_step

from hf_cocodr import CocoPretrainer, CondenserForPretraining
from hf_cocodr.data.spans import SpanCorpus, group_sentences, split_sentences_regex


@pytest.fixture(scope="module")
def tiny_bert_nodrop(tmp_path_factory):
    import tiny

    return tiny.make_tiny_bert(tmp_path_factory.mktemp("nodrop"), dropout=0.0, seed=3)


def test_sentence_splitter_and_grouping():
    text = "Dr. Smith et al. measured 3.5 mg. The result was clear! Was it? Yes. See Fig. 2 for details."
    assert split_sentences_regex(text) == [
        "Dr. Smith et al. measured 3.5 mg.",
        "The result was clear!",
        "Was it?",
        "Yes.",
        "See Fig. 2 for details.",
    ]
    rng = np.random.default_rng(0)
    assert group_sentences([10, 10, 15, 40, 5], 30, 0.0, rng) == [(0, 2), (2, 3), (3, 4), (4, 5)]
    # with break probability 1 every boundary closes the span
    assert group_sentences([1, 1, 1], 30, 0.999999, rng) == [(0, 1), (1, 2), (2, 3)]


def test_masking_is_on_the_encoded_ids_and_whole_words(tiny_bert_dir, tiny_beir):
    from transformers import AutoTokenizer

    from hf_cocodr.pretraining.collator import SpanPairBuilder

    tok = AutoTokenizer.from_pretrained(tiny_bert_dir)
    spans = SpanCorpus.build([tiny_beir], tok, cache=False)
    builder = SpanPairBuilder(spans, tok, mlm_probability=0.3)
    batch = builder.build(np.arange(6), step=0, seed=1)
    ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
    assert ids.shape[0] == 12  # two spans per document, interleaved
    vocab = {v: k for k, v in tok.get_vocab().items()}
    for r in range(ids.shape[0]):
        masked = (labels[r] != -100).nonzero().flatten().tolist()
        assert masked, "every span gets at least one masked token"
        assert ids[r, 0] == tok.cls_token_id and labels[r, 0] == -100
        # reconstruct the encoded span: labels hold the original id wherever the input was changed
        original = torch.where(labels[r] != -100, labels[r], ids[r])[: int(mask[r].sum())]
        # whole-word: a masked continuation piece implies its word start is masked as well
        for p in masked:
            if vocab[int(original[p])].startswith("##"):
                q = p
                while vocab[int(original[q])].startswith("##"):
                    q -= 1
                assert q in masked
    # the two spans of a document differ, and the pair is re-drawn at another step
    d0 = builder.build(np.arange(6), step=0, seed=1)
    d1 = builder.build(np.arange(6), step=1, seed=1)
    assert torch.equal(d0["input_ids"], batch["input_ids"])  # deterministic per (seed, step)
    assert not torch.equal(d0["labels"], d1["labels"])


def test_two_distinct_spans_per_document(tiny_bert_dir, tiny_beir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_bert_dir)
    spans = SpanCorpus.build([tiny_beir], tok, cache=False)
    rng = np.random.default_rng(0)
    for d in range(len(spans)):
        own = spans.spans_of(d)
        assert len(own) >= 2
        for _ in range(5):
            a, b = spans.sample_pair(d, rng, 64)
            ia = [i for i, s in enumerate(own) if np.array_equal(s, a)]
            ib = [i for i, s in enumerate(own) if np.array_equal(s, b)]
            assert ia and ib, "both halves of the pair are spans of their document"
            assert not np.array_equal(a, b) and set(ia) != set(ib), "the two spans are distinct"


def test_random_crops_do_not_overlap(tiny_bert_dir, tiny_beir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_bert_dir)
    spans = SpanCorpus.build([tiny_beir], tok, mode="random_crops", cache=False)
    rng = np.random.default_rng(0)
    toks = spans.spans_of(0)[0]
    for _ in range(20):
        a, b = spans.sample_pair(0, rng, 8)
        assert len(a) == len(b) == 8
        ia = next(i for i in range(len(toks)) if np.array_equal(toks[i : i + 8], a))
        ib = next(i for i in range(len(toks)) if np.array_equal(toks[i : i + 8], b))
        assert abs(ia - ib) >= 8


def test_gradient_cache_equals_uncached(tiny_bert_nodrop, tiny_beir, tmp_path):
    _, g_plain = grads_after_step(tiny_bert_nodrop, tiny_beir, tmp_path / "a", chunk=0)
    tr, g_cache = grads_after_step(tiny_bert_nodrop, tiny_beir, tmp_path / "b", chunk=3)
    assert g_plain.keys() == g_cache.keys() and len(g_plain) > 20
    scale = max(float(g.norm()) for g in g_plain.values())
    for n in g_plain:
        a, b = g_plain[n], g_cache[n]
        if a.norm() < 1e-6 * scale:  # mathematically zero (e.g. attention key biases): compare absolutely
            assert (a - b).norm() < 1e-6 * scale, n
            continue
        rel = (a - b).norm() / a.norm()
        assert rel < 1e-5, (n, float(rel))


def test_gradient_cache_replays_dropout(tiny_bert_dir, tiny_beir, tmp_path):
    args = coco_args(tmp_path, gradient_cache_chunk_size=3, max_steps=1)
    trainer = CocoPretrainer(str(tiny_bert_dir), args, corpora=[tiny_beir])
    assert any(m.p > 0 for m in trainer.model.modules() if isinstance(m, torch.nn.Dropout))
    trainer.train()
    assert trainer.last_gradcache_rep_diff == 0.0  # the grad pass saw exactly the no-grad pass's dropout


def test_loss_components_logged_and_accumulation_not_doubled(tiny_bert_nodrop, tiny_beir, tmp_path):
    one, _ = grads_after_step(tiny_bert_nodrop, tiny_beir, tmp_path / "a", chunk=0, batch=8)
    acc, _ = grads_after_step(tiny_bert_nodrop, tiny_beir, tmp_path / "b", chunk=0, batch=4, accumulation=2)
    for tr in (one, acc):
        logged = tr.state.log_history[0]
        for key in ("mlm_loss", "head_mlm_loss", "contrastive_loss", "loss"):
            assert key in logged
    # same documents, half batches accumulated: the MLM parts agree; the logged loss is not doubled
    l1, l2 = one.state.log_history[0], acc.state.log_history[0]
    assert l2["loss"] == pytest.approx(l2["mlm_loss"] + l2["head_mlm_loss"] + l2["contrastive_loss"], rel=1e-3)
    assert l2["mlm_loss"] == pytest.approx(l1["mlm_loss"], rel=0.05)


def test_condenser_head_save_load_and_skip_from(tiny_bert_dir, tmp_path):
    m = CondenserForPretraining.from_pretrained(tiny_bert_dir)
    assert m.skip_from == 1  # half of 2 layers
    with pytest.raises(ValueError, match="skip_from=2 must be between 1 and 1"):
        CondenserForPretraining.from_pretrained(tiny_bert_dir, skip_from=2)
    m.lm.save_pretrained(tmp_path)
    m.save_head(tmp_path)
    cfg = json.loads((tmp_path / "condenser_head.json").read_text())
    assert cfg["n_head_layers"] == 2 and cfg["skip_from"] == 1
    m2 = CondenserForPretraining.from_pretrained(tmp_path)
    for (n, a), b in zip(m.c_head.state_dict().items(), m2.c_head.state_dict().values()):
        torch.testing.assert_close(a, b, msg=n)


def test_loaded_condenser_is_in_one_mode(tiny_bert_nomlm_dir):
    """Like transformers' from_pretrained: the whole module (encoder, fresh Condenser head, fresh MLM head) in eval
    mode, so a forward outside the Trainer is deterministic; train() reaches every submodule."""
    m = CondenserForPretraining.from_pretrained(tiny_bert_nomlm_dir)
    assert [n for n, mod in m.named_modules() if mod.training] == []
    m.train()
    assert [n for n, mod in m.named_modules() if not mod.training] == []


def test_missing_mlm_head_is_created_tied(tiny_bert_nomlm_dir, caplog):
    with caplog.at_level(logging.WARNING):
        m = CondenserForPretraining.from_pretrained(tiny_bert_nomlm_dir)
    assert any("has no MLM head" in r.getMessage() for r in caplog.records)
    dec = m.lm.get_output_embeddings().weight
    assert dec.data_ptr() == m.lm.get_input_embeddings().weight.data_ptr()


def test_continue_from_exported_directory(tiny_bert_dir, tiny_beir, tmp_path):
    """OUT is a sentence-transformers directory + head; pretraining continues from it with the trained head."""
    args = coco_args(tmp_path / "out", max_steps=2)
    tr = CocoPretrainer(str(tiny_bert_dir), args, corpora=[tiny_beir])
    tr.train()
    tr.export(tmp_path / "out")
    from sentence_transformers import SentenceTransformer

    from hf_cocodr.modeling.loading import pooling_mode

    st = SentenceTransformer(str(tmp_path / "out"))
    assert pooling_mode(st) == "cls" and st.similarity_fn_name == "dot"
    again = CondenserForPretraining.from_pretrained(tmp_path / "out")
    for a, b in zip(tr.condenser.c_head.parameters(), again.c_head.parameters()):
        torch.testing.assert_close(a, b)
    _, mlm_a = next((k, v) for k, v in tr.condenser.head_state_dict().items() if k.startswith("mlm_head."))
    _, mlm_b = next((k, v) for k, v in again.head_state_dict().items() if k.startswith("mlm_head."))
    torch.testing.assert_close(mlm_a, mlm_b)
    # embeddings of the exported model are the CLS states of the trained backbone
    tr.condenser.eval()
    batch = tr.processing_class(["cardiac artery pulse"], return_tensors="pt")
    with torch.no_grad():
        cls = tr.condenser.encoder_model(**batch).last_hidden_state[:, 0]
    torch.testing.assert_close(st.encode(["cardiac artery pulse"], convert_to_tensor=True), cls, atol=1e-5, rtol=1e-5)


def test_export_keeps_the_starting_models_max_seq_length(tiny_bert_dir, tiny_beir, tmp_path):
    """A sentence-transformers start keeps its declared token limit; a raw checkpoint gets its position limit."""
    from sentence_transformers import SentenceTransformer

    from hf_cocodr.export import export_sentence_transformer

    start, legacy = tmp_path / "st", tmp_path / "st5"  # the 6.x and the 5.x directory layouts
    export_sentence_transformer(str(tiny_bert_dir), start, max_seq_length=48)
    export_sentence_transformer(str(tiny_bert_dir), legacy, max_seq_length=40, legacy_format=True)
    for src, expected in ((start, 48), (legacy, 40), (tiny_bert_dir, None)):
        out = tmp_path / f"out-{expected}"
        tr = CocoPretrainer(str(src), coco_args(out, max_steps=1), corpora=[tiny_beir])
        tr.train()
        tr.export(out)
        limit = min(512, tr.condenser.config.max_position_embeddings)
        assert SentenceTransformer(str(out)).max_seq_length == (expected or limit)


def test_bad_corpora(tiny_bert_dir, tmp_path):
    from datasets import Dataset

    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="is empty"):
        CocoPretrainer(str(tiny_bert_dir), coco_args(tmp_path / "out"), corpora=[tmp_path / "empty.jsonl"])
    with pytest.raises(ValueError, match="has no 'text' column"):
        CocoPretrainer(
            str(tiny_bert_dir), coco_args(tmp_path / "out"), corpora=[Dataset.from_dict({"body": ["a b c"]})]
        )
    short = Dataset.from_dict({"text": ["One short sentence only."] * 20})
    with pytest.raises(ValueError, match="no document yields two spans"):
        CocoPretrainer(str(tiny_bert_dir), coco_args(tmp_path / "out"), corpora=[short])
    (tmp_path / "bad.jsonl").write_text('{"text": "fine. Two. Sentences here."}\n{"txt": "oops"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl, line 2: missing field 'text'"):
        CocoPretrainer(str(tiny_bert_dir), coco_args(tmp_path / "out"), corpora=[tmp_path / "bad.jsonl"])
    with pytest.raises(FileNotFoundError, match="not found"):
        CocoPretrainer(str(tiny_bert_dir), coco_args(tmp_path / "out"), corpora=[tmp_path / "missing"])


@pytest.mark.parametrize("chunk", [0, 3])
def test_mlm_weight_zero_runs_no_mlm_forward(tiny_bert_nodrop, tiny_beir, tmp_path, chunk):
    """Contrast-only COCO: spans are not masked, the MLM prediction head never runs, loss == contrastive loss."""
    from hf_cocodr.modeling.condenser import _mlm_head

    args = coco_args(tmp_path, mlm_weight=0.0, head_mlm_weight=0.0, gradient_cache_chunk_size=chunk, max_steps=2)
    trainer = CocoPretrainer(str(tiny_bert_nodrop), args, corpora=[tiny_beir])
    calls = []
    _, head = _mlm_head(trainer.condenser.lm)
    head.register_forward_hook(lambda *a: calls.append(1))
    batch = trainer.builder.build(np.arange(4), step=0, seed=0)
    assert "labels" not in batch and not (batch["input_ids"] == trainer.builder.mask_id).any()
    trainer.train()
    assert calls == []
    for logged in [h for h in trainer.state.log_history if "contrastive_loss" in h]:
        assert logged["mlm_loss"] == 0.0 and logged["head_mlm_loss"] == 0.0
        assert logged["loss"] == pytest.approx(logged["contrastive_loss"], rel=1e-4)
    # with MLM on, the same setup does run the head (the hook is live)
    on = CocoPretrainer(str(tiny_bert_nodrop), coco_args(tmp_path / "on", max_steps=1), corpora=[tiny_beir])
    _, head_on = _mlm_head(on.condenser.lm)
    head_on.register_forward_hook(lambda *a: calls.append(1))
    on.train()
    assert calls


def test_pretrain_into_a_folder_of_user_files_is_refused_before_training(tiny_bert_dir, tiny_beir, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("\\documentclass{article}")
    with pytest.raises(FileExistsError, match="did not write"):
        CocoPretrainer(str(tiny_bert_dir), coco_args(out), corpora=[tiny_beir])
    assert [p.name for p in out.iterdir()] == ["thesis.tex"]
    assert (out / "thesis.tex").read_text() == "\\documentclass{article}"
