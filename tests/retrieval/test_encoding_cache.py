"""One encoding per model per corpus: the disk cache of corpus encodings serves exactly what a fresh encoding builds,
and never when the model, the corpus, the length or the precision changed; a recipe run encodes each corpus once
per model (its record and the encoder's calls say so); what one run's encoding session holds (its precision, its
kept indexes, its fits) never reaches another's."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from hf_cocodr.data.beir import load_corpus
from hf_cocodr.modeling.loading import load_encoder
from hf_cocodr.retrieval.encoding import build_index
from hf_cocodr.retrieval.encoding_cache import document_encoder_key
from hf_cocodr.retrieval.session import EncodingSession

pytestmark = pytest.mark.usefixtures("own_cache")  # each test its own cache (tests/conftest.py)


def _vectors(model, corpus, **kw):
    index, order = build_index(model, corpus, show_progress_bar=False, **kw)
    return index.reconstruct_all(), order


def test_a_cached_encoding_is_the_fresh_one_and_a_repeated_run_reads_it(tiny_st_dir, tiny_beir):
    model, corpus = load_encoder(str(tiny_st_dir)), load_corpus(tiny_beir)
    fresh, fresh_order = _vectors(model, corpus)  # no cache without a caching session
    first, second = EncodingSession(cache=True), EncodingSession(cache=True)  # two runs, the same disk cache
    a, order_a = _vectors(model, corpus, session=first)
    b, order_b = _vectors(load_encoder(str(tiny_st_dir)), load_corpus(tiny_beir), session=second)
    first, second = first.record, second.record
    assert [r["source"] for r in first] == ["encoded"] and [r["source"] for r in second] == ["disk cache"]
    assert np.array_equal(a, fresh) and np.array_equal(b, fresh)  # bit for bit, in the same index order
    assert np.array_equal(order_a, fresh_order) and np.array_equal(order_b, fresh_order)
    assert first[0]["num_docs"] == len(corpus) and first[0]["seconds"] >= 0


def test_a_changed_model_corpus_length_or_precision_is_never_served_from_the_cache(tiny_st_dir, tiny_beir, tmp_path):
    model, corpus = load_encoder(str(tiny_st_dir)), load_corpus(tiny_beir)
    run = EncodingSession(cache=True)
    _vectors(model, corpus, session=run)
    other = copy.deepcopy(model)
    with torch.no_grad():
        next(other.parameters()).add_(1e-3)  # one weight moved
    changed = tmp_path / "changed"
    changed.mkdir()
    lines = (tiny_beir / "corpus.jsonl").read_text().splitlines()
    doc = json.loads(lines[5])
    doc["text"] += " one more word"
    (changed / "corpus.jsonl").write_text("\n".join(lines[:5] + [json.dumps(doc)] + lines[6:]) + "\n")
    got = {
        "model": _vectors(other, corpus, session=run)[0],
        "corpus": _vectors(model, load_corpus(changed), session=run)[0],
        "length": _vectors(model, corpus, max_length=8, session=run)[0],
    }
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got["precision"] = _vectors(model, corpus, session=run)[0]
    _vectors(model, corpus, session=run)  # the unchanged one: read back
    record = run.record
    assert [r["source"] for r in record] == ["encoded"] * 5 + ["disk cache"]
    assert len({(r["document_encoder"], r["corpus"], r["max_length"], r["precision"]) for r in record[:5]}) == 5
    assert record[4]["precision"] == "bf16" and record[3]["max_length"] == 8
    # and each is what that model, corpus, length or precision encodes afresh (outside the cache)
    assert np.array_equal(got["model"], _vectors(other, corpus)[0])
    assert np.array_equal(got["length"], _vectors(model, corpus, max_length=8)[0])


def test_the_document_route_of_a_router_model_shares_the_plain_models_encoding(tiny_st_dir, tiny_beir):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Router

    start = load_encoder(str(tiny_st_dir))
    query_side = copy.deepcopy(start)
    with torch.no_grad():
        next(query_side.parameters()).add_(1e-2)  # a query encoder that moved
    router = Router.for_query_document(list(query_side.children()), list(copy.deepcopy(start).children()))
    asym = SentenceTransformer(modules=[router], similarity_fn_name=start.similarity_fn_name)
    assert document_encoder_key(asym) == document_encoder_key(start) != document_encoder_key(query_side)
    corpus = load_corpus(tiny_beir)
    run = EncodingSession(cache=True)
    a = _vectors(start, corpus, session=run)[0]
    b = _vectors(asym, corpus, session=run)[0]
    assert [r["source"] for r in run.record] == ["encoded", "disk cache"] and np.array_equal(a, b)


def test_the_fusion_fit_runs_once_per_model_and_corpus_in_a_run(tiny_st_dir, tiny_beir, monkeypatch):
    """In a run's session, the hybrid evaluation and a retriever of one model over one corpus for the same queries
    fit the fusion once, to what a fit without a session gives; a query-side model (its own query route, its start's
    document route) fits again but encodes none of the fit's documents (those without their pseudo-query's sentence)
    that its start encoded already."""
    import hf_cocodr.retrieval.encoding as encoding
    import hf_cocodr.retrieval.fusion_fit as fusion_fit
    from hf_cocodr import evaluate_retrieval
    from hf_cocodr.modeling.asymmetric import query_side_model
    from hf_cocodr.retrieval.hybrid import HybridRetriever, _corpus_ids_texts

    corpus = set(_corpus_ids_texts(tiny_beir)[1])
    fits, fit_docs = [], []
    real_fit, real_encode = fusion_fit.fit_fusion, encoding.encode_texts

    def fit(*args, **kw):
        fits.append(1)
        return real_fit(*args, **kw)

    def encode(model, texts, *, kind, **kw):
        if kind == "document" and not set(texts) <= corpus:  # documents with a sentence taken out: the fit's
            fit_docs.append(len(texts))
        return real_encode(model, texts, kind=kind, **kw)

    from hf_cocodr.data import load_beir

    queries = list(load_beir(tiny_beir, "dev").queries["text"])  # what the evaluation calibrates its fit to
    model = load_encoder(str(tiny_st_dir))
    fresh = HybridRetriever.build(model, tiny_beir, queries=queries).fusion  # no session: nothing remembered
    monkeypatch.setattr(fusion_fit, "fit_fusion", fit)
    monkeypatch.setattr(encoding, "encode_texts", encode)
    monkeypatch.setattr("hf_cocodr.evaluation.retrieval.encode_texts", encode)
    run = EncodingSession(cache=True)
    evaluated = evaluate_retrieval(model, tiny_beir, "dev", hybrid=True, show_progress_bar=False, session=run)
    built = HybridRetriever.build(model, tiny_beir, queries=queries, session=run).fusion
    assert len(fits) == 1 and built == fresh
    HybridRetriever.build(model, tiny_beir, session=run)  # other queries (none): a fit of its own
    assert len(fits) == 2
    assert evaluated["fusion"]["dense_weight"] == fresh.dense_weight
    assert evaluated["fusion"]["normalize"] == fresh.normalize
    assert len(fit_docs) >= 1
    asym = query_side_model(model)
    with torch.no_grad():  # the query route moved: its fit is its own, its fit documents are the start's
        for p in asym[0].sub_modules["query"].parameters():
            p.mul_(1.5)
    before = len(fit_docs)
    HybridRetriever.build(asym, tiny_beir, queries=queries, session=run)
    assert len(fits) == 3 and len(fit_docs) == before


def test_a_run_in_bf16_encodes_under_autocast_and_never_shares_the_fp32_encoding(tiny_st_dir, tiny_beir):
    """In a bf16 session a corpus is encoded as under the caller's own bf16 autocast, cached under its own key, and
    neither precision is served the other's vectors."""
    model, corpus = load_encoder(str(tiny_st_dir)), load_corpus(tiny_beir)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        by_hand, _ = _vectors(model, corpus)  # no cache without a caching session
    fp32, _ = _vectors(model, corpus)
    record: list = []  # two sessions of one run's record: fp32, then bf16
    got = {"fp32": _vectors(model, corpus, session=EncodingSession(cache=True, record=record))[0]}
    got["bf16"] = _vectors(model, corpus, session=EncodingSession("bf16", cache=True, record=record))[0]
    again = EncodingSession("bf16", cache=True)  # another run: read back
    got["bf16 again"] = _vectors(load_encoder(str(tiny_st_dir)), load_corpus(tiny_beir), session=again)[0]
    assert [(r["precision"], r["source"]) for r in record] == [("fp32", "encoded"), ("bf16", "encoded")]
    assert [(r["precision"], r["source"]) for r in again.record] == [("bf16", "disk cache")]
    assert np.array_equal(got["bf16"], by_hand) and np.array_equal(got["bf16 again"], by_hand)
    assert np.array_equal(got["fp32"], fp32) and not np.array_equal(by_hand, fp32)


def test_auto_encodes_in_bf16_only_where_the_machine_computes_it_natively(monkeypatch):
    import hf_cocodr.modeling.precision as precision
    from hf_cocodr.errors import ConfigError
    from hf_cocodr.modeling.precision import resolve_corpus_precision
    from hf_cocodr.recipe import RecipeConfig

    for native, expected in ((True, "bf16"), (False, "fp32")):
        monkeypatch.setattr(precision, "native_bf16", lambda native=native: native)
        assert resolve_corpus_precision("auto")[0] == expected
        assert resolve_corpus_precision("fp32") == ("fp32", "asked for")  # what is asked for is kept
        assert resolve_corpus_precision("bf16") == ("bf16", "asked for")
    with pytest.raises(ConfigError, match="encode_precision"):
        resolve_corpus_precision("int8")  # int8 lost nDCG@10 (docs/precision.md): evaluate-only
    from hf_cocodr.recipe.config import ENCODE_PRECISIONS

    assert ENCODE_PRECISIONS == precision.CORPUS_PRECISIONS  # the flag's choices are what a run can resolve
    with pytest.raises(ConfigError, match="encode_precision must be 'auto', 'fp32' or 'bf16', got 'fp16'"):
        RecipeConfig(encode_precision="fp16").validate()
    assert EncodingSession().precision == "fp32"  # a call without a session encodes as the model is
    with pytest.raises(ConfigError, match="fp32 or bf16, got 'int8'"):
        EncodingSession("int8")  # a session holds what a run resolved, never "auto" or int8


def test_the_teachers_cache_is_keyed_by_the_encoding_precision(tiny_beir):
    from hf_cocodr.retrieval.hybrid import _corpus_ids_texts, corpus_fingerprint
    from hf_cocodr.retrieval.teacher import teacher_cache_path
    from hf_cocodr.rundir.run_record import digest

    ids, texts = _corpus_ids_texts(str(tiny_beir))
    fp32 = teacher_cache_path("key", ids, texts)
    # fp32 keeps the key it always had (the caches of earlier runs stay valid)
    assert fp32.name == "hybrid-" + digest({"teacher": 2, "model": "key", "corpus": corpus_fingerprint(ids, texts)})
    assert teacher_cache_path("key", ids, texts, EncodingSession("fp32")) == fp32
    assert teacher_cache_path("key", ids, texts, EncodingSession("bf16")) != fp32


def test_the_in_memory_reuse_never_serves_another_precision(tiny_st_dir, tiny_beir):
    """In a reusing session, a corpus encoded in fp32 is not served to the same model under bf16, whether a session
    sharing its kept indexes asks for bf16 or the caller set autocast, and each bf16 index is what bf16 encodes
    afresh."""
    from dataclasses import replace

    model, corpus = load_encoder(str(tiny_st_dir)), load_corpus(tiny_beir)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fresh_bf16, _ = _vectors(model, corpus)
    reusing = EncodingSession().with_reuse()
    fp32, _ = _vectors(model, corpus, session=reusing)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        by_caller, _ = _vectors(model, corpus, session=reusing)
    by_run, _ = _vectors(model, corpus, session=replace(reusing, precision="bf16"))  # the same kept indexes
    assert len(reusing.indexes) == 2  # fp32 and bf16, each under its own key
    assert not np.array_equal(fp32, fresh_bf16)
    assert np.array_equal(by_caller, fresh_bf16) and np.array_equal(by_run, fresh_bf16)


def test_the_native_bf16_switch_forces_either_path_on_any_machine(monkeypatch):
    """HF_COCODR_NATIVE_BF16 decides what the machine is taken to compute natively (the suite pins it, and forces
    each path where it tests it), for every choice made from it: the run's corpus-encoding precision included. A
    value other than 0 or 1 is refused by name, unset detects."""
    from hf_cocodr.errors import ConfigError
    from hf_cocodr.modeling.precision import resolve_corpus_precision
    from hf_cocodr.utils import native_bf16

    for value, native, encoding in (("1", True, "bf16"), ("0", False, "fp32"), (" 1 ", True, "bf16")):
        monkeypatch.setenv("HF_COCODR_NATIVE_BF16", value)
        assert native_bf16() is native
        assert resolve_corpus_precision("auto")[0] == encoding
    monkeypatch.setenv("HF_COCODR_NATIVE_BF16", "yes")
    with pytest.raises(ConfigError, match="HF_COCODR_NATIVE_BF16 must be 0 or 1 .*'yes'"):
        native_bf16()
    monkeypatch.delenv("HF_COCODR_NATIVE_BF16")
    import torch

    if not torch.cuda.is_available():  # unset: the CPU's own answer (oneDNN's bf16 kernels)
        assert native_bf16() is bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def test_two_evaluations_in_two_precisions_interleaved_never_share_an_encoding(tiny_st_dir, tiny_beir, monkeypatch):
    """Two runs in one process, one fp32 and one bf16, each with its own caching and reusing session, evaluate the
    same model on the same split in turn: each encodes the corpus once in its own precision (never served the other's
    vectors, from the disk or from memory), and each result is what a call without the cache gives in that
    precision (cached == uncached)."""
    import hf_cocodr.retrieval.encoding as encoding
    from hf_cocodr import evaluate_retrieval

    model = load_encoder(str(tiny_st_dir))

    def evaluate(session):
        res = evaluate_retrieval(
            model, tiny_beir, "dev", hybrid=True, return_run=True, show_progress_bar=False, session=session
        )
        return res["run"], res["dense"]["ndcg@10"], res["ndcg@10"], res["fusion"]

    expected = {p: evaluate(EncodingSession(p)) for p in ("fp32", "bf16")}  # no cache, nothing kept
    assert expected["fp32"][0] != expected["bf16"][0]  # the two precisions rank with other scores
    encoded = []
    real = encoding.encode_texts

    from hf_cocodr.data.beir import doc_text, load_beir

    corpus = load_beir(tiny_beir, "dev").corpus
    documents = {doc_text(t, x) for t, x in zip(corpus["title"], corpus["text"])}

    def counting(m, texts, *, kind, **kw):
        # the whole toy corpus (one chunk), not the fusion fit's documents (their pseudo-queries' words taken out)
        if kind == "document" and len(texts) == 80 and set(texts) == documents:
            encoded.append(kw["session"].precision)
        return real(m, texts, kind=kind, **kw)

    monkeypatch.setattr(encoding, "encode_texts", counting)
    runs = {p: EncodingSession(p, cache=True).with_reuse() for p in ("fp32", "bf16")}
    got = {p: [] for p in runs}
    for p in ("fp32", "bf16", "fp32", "bf16"):
        got[p].append(evaluate(runs[p]))
    assert sorted(encoded) == ["bf16", "fp32"]  # one encoding each
    for p, session in runs.items():
        assert got[p] == [expected[p], expected[p]]
        assert [(r["precision"], r["source"]) for r in session.record] == [(p, "encoded"), (p, "memory")]


def test_a_fit_memo_of_one_run_is_never_read_by_another(tiny_st_dir, tiny_beir, monkeypatch):
    """A run's session fits a corpus's fusion once; another run's session fits it again (to the same fusion), and a
    call without a session fits every time."""
    import hf_cocodr.retrieval.fusion_fit as fusion_module
    from hf_cocodr.retrieval.hybrid import HybridRetriever

    fits = []
    real_fit = fusion_module.fit_fusion
    monkeypatch.setattr(fusion_module, "fit_fusion", lambda *a, **kw: fits.append(1) or real_fit(*a, **kw))
    model = load_encoder(str(tiny_st_dir))
    first, second = EncodingSession(cache=True), EncodingSession(cache=True)
    a = HybridRetriever.build(model, tiny_beir, session=first).fusion
    assert HybridRetriever.build(model, tiny_beir, session=first).fusion == a and len(fits) == 1
    assert HybridRetriever.build(model, tiny_beir, session=second).fusion == a and len(fits) == 2
    assert HybridRetriever.build(model, tiny_beir, session=second).fusion == a and len(fits) == 2
    assert first.memo and second.memo and not set(map(id, first.memo.values())) & set(map(id, second.memo.values()))
    HybridRetriever.build(model, tiny_beir)
    HybridRetriever.build(model, tiny_beir)
    assert len(fits) == 4
