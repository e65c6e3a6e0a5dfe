"""Bad input sweep: every public entry point fed malformed input gets one clear error (what, where, how to fix).

CLI cases assert exit status 2 and exactly one stderr line; Python cases assert the exception type and message.
No case may end in a traceback from deep inside a library or in a silent empty run.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import beir, run_cli

from hf_cocodr.cli import main

# --------------------------------------------------------------------------------------------- data files
DATA_CASES = {
    "empty corpus": (dict(corpus=""), "corpus.jsonl: the corpus file is empty"),
    "garbled jsonl": (dict(corpus='{"_id": "d0", "text": "ok"}\n{garbage\n'), "corpus.jsonl, line 2: malformed JSON"),
    "wrong column names": (
        dict(corpus='{"id": "d0", "body": "text"}\n'),
        "missing required field '_id' (found ['id', 'body']",
    ),
    "non-utf8 bytes": (dict(corpus=b'{"_id": "d0", "text": "caf\xe9"}\n'), "corpus.jsonl, line 1: not valid UTF-8"),
    "qrels pointing nowhere": (
        dict(qrels="query-id\tcorpus-id\tscore\nq1\tmissing-doc\t1\n"),
        "train.tsv, line 2: corpus-id 'missing-doc' is not in",
    ),
    "qrels unknown query": (dict(qrels="query-id\tcorpus-id\tscore\nq404\td1\t1\n"), "query-id 'q404' is not in"),
}


@pytest.mark.parametrize("case", sorted(DATA_CASES))
@pytest.mark.parametrize("command", ["bm25", "evaluate", "finetune", "mteb"])
def test_malformed_data_files(case, command, tmp_path, capsys, tiny_st_dir):
    kwargs, needle = DATA_CASES[case]
    folder = beir(tmp_path / "data", **kwargs)
    args = {
        "bm25": ["bm25", folder, "--split", "train"],
        "evaluate": ["evaluate", tiny_st_dir, folder, "--split", "train"],
        "finetune": [
            "finetune",
            "--model",
            tiny_st_dir,
            "--train-data",
            folder,
            "--output_dir",
            tmp_path / "o",
            "--max_steps",
            "1",
            "--use_cpu",
        ],
        "mteb": [
            "mteb",
            tiny_st_dir,
            folder,
            "--split",
            "train",
            "--task-name",
            "BadData",
            "--model-name",
            "acme/x",
            "--revision",
            "r1",
            "--output-folder",
            tmp_path / "m",
        ],
    }[command]
    assert needle in run_cli(args, capsys)


def test_missing_split_lists_available(tmp_path, capsys):
    folder = beir(tmp_path / "data")
    assert "split 'dev' not found; available splits: ['train']" in run_cli(["bm25", folder, "--split", "dev"], capsys)


def test_huge_single_document_is_handled(tiny_st_dir, tmp_path, capsys):
    big = "word " * 200_000  # 1 MB of text in one document
    docs = (
        json.dumps({"_id": "d0", "title": "", "text": big + ". Another sentence. And one more."})
        + "\n"
        + "".join(
            json.dumps({"_id": f"d{i}", "text": f"Sentence about topic {i}. Second sentence."}) + "\n"
            for i in range(1, 12)
        )
    )
    folder = beir(tmp_path / "data", corpus=docs)
    assert main(["evaluate", str(tiny_st_dir), str(folder), "--split", "train", "--backend", "torch"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["num_docs"] == 12
    from transformers import AutoTokenizer

    from hf_cocodr.data.spans import SpanCorpus

    spans = SpanCorpus.build([folder], AutoTokenizer.from_pretrained(tiny_st_dir), cache=False, max_doc_tokens=4096)
    longest = int(np.diff(spans.span_tok_ptr).max())
    assert 1 <= len(spans) and longest <= 4096  # the huge document is bounded, not a crash or an unbounded span


# --------------------------------------------------------------------------------------------- training inputs
def test_corpus_without_two_spans(tiny_bert_dir, tmp_path, capsys):
    folder = beir(
        tmp_path / "data", corpus="".join(json.dumps({"_id": f"d{i}", "text": "Short."}) + "\n" for i in range(12))
    )
    msg = run_cli(
        [
            "pretrain",
            "--model",
            tiny_bert_dir,
            "--corpus",
            folder,
            "--output_dir",
            tmp_path / "o",
            "--max_steps",
            "1",
            "--use_cpu",
        ],
        capsys,
    )
    assert "no document yields two spans" in msg and "random_crops" in msg


def test_empty_training_set(tiny_st_dir, tmp_path, capsys):
    folder = beir(tmp_path / "data", qrels="query-id\tcorpus-id\tscore\nq1\td1\t0\n")  # nothing relevant
    msg = run_cli(
        [
            "finetune",
            "--model",
            tiny_st_dir,
            "--train-data",
            folder,
            "--output_dir",
            tmp_path / "o",
            "--max_steps",
            "1",
            "--use_cpu",
        ],
        capsys,
    )
    assert "no queries with a labelled positive" in msg


def test_training_set_smaller_than_a_batch(tiny_st_dir, tmp_path, capsys):
    folder = beir(tmp_path / "data")
    msg = run_cli(
        [
            "finetune",
            "--model",
            tiny_st_dir,
            "--train-data",
            folder,
            "--output_dir",
            tmp_path / "o",
            "--max_steps",
            "1",
            "--per_device_train_batch_size",
            "64",
            "--use_cpu",
        ],
        capsys,
    )
    assert "cannot fill one batch of 64" in msg


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--idro-preset", "bogus"], "invalid choice: 'bogus'"),
        (["--tau", "0"], "idro_tau must be > 0"),
        (["--num-clusters", "0"], "num_clusters must be >= 1"),
        (["--negatives_top_k", "5", "--negatives_skip_top", "10"], "must be larger than negatives_skip_top"),
        (["--push_to_hub"], "push_to_hub=True needs hub_model_id"),
        (["--no-such-flag", "1"], "unrecognized arguments: --no-such-flag"),
        (["--learning_rate", "fast"], "invalid float value: 'fast'"),
        (["--method", "nope"], "unknown method(s) ['nope']; choose from ['modir', 'berm', 'rmsc']"),
    ],
)
def test_conflicting_or_invalid_finetune_arguments(extra, needle, tiny_st_dir, tmp_path, capsys):
    folder = beir(tmp_path / "data")
    msg = run_cli(
        [
            "finetune",
            "--model",
            tiny_st_dir,
            "--train-data",
            folder,
            "--output_dir",
            tmp_path / "o",
            "--max_steps",
            "1",
            "--use_cpu",
            "--per_device_train_batch_size",
            "4",
            *extra,
        ],
        capsys,
    )
    assert needle in msg


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--skip_from", "5"], "skip_from=5 must be between 1 and 1"),
        (["--span_mode", "paragraphs"], "span_mode must be 'sentence_groups' or 'random_crops'"),
        (["--gradient_cache_chunk_size", "-1"], "gradient_cache_chunk_size must be >= 0"),
        (["--mlm_probability", "1.5"], "mlm_probability must be in (0, 1)"),
    ],
)
def test_invalid_pretrain_arguments(extra, needle, tiny_bert_dir, tmp_path, capsys):
    folder = beir(tmp_path / "data")
    msg = run_cli(
        [
            "pretrain",
            "--model",
            tiny_bert_dir,
            "--corpus",
            folder,
            "--output_dir",
            tmp_path / "o",
            "--max_steps",
            "1",
            "--use_cpu",
            *extra,
        ],
        capsys,
    )
    assert needle in msg


@pytest.mark.parametrize(
    "args, needle",
    [
        (["finetune", "--train-data", "x", "--output_dir", "o"], "--model is required"),
        (["pretrain", "--model", "m", "--output_dir", "o"], "at least one --corpus is required"),
        # no target corpus: the source fine-tuning alone, which needs the source task
        (["recipe", "--model", "m", "--output_dir", "o"], "trains on the labelled source task, and no source data"),
        (
            ["recipe", "--model", "m", "--source-data", "s", "--output_dir", "o", "--max-minutes", "-3"],
            "--max-minutes must be a positive number",
        ),
        (
            ["recipe", "--model", "m", "--source-data", "s", "--output_dir", "o", "--max-minutes", "nan"],
            "--max-minutes must be a positive number",
        ),
        (
            ["recipe", "--model", "m", "--source-data", "s", "--output_dir", "o", "--wise-alpha", "half"],
            "--wise-alpha must be a number",
        ),
        (
            ["recipe", "--model", "m", "--source-data", "s", "--output_dir", "o", "--distill-max-passes", "lots"],
            "--distill-max-passes must be a number > 0, 'none' or 'auto', got 'lots'",
        ),
        (["finetune", "--model", "m", "--train-data", "d"], "--output_dir is required"),
        (["evaluate", "no/such-model-xyz", "data", "--split", "dev"], "not found"),
        (["export", "missing-dir-xyz", "out"], "not found"),
        (
            ["finetune", "--model", "m", "--train-data", "d", "--output_dir", "o", "--config", "missing.yaml"],
            "--config missing.yaml: file not found",
        ),
    ],
)
def test_cli_missing_or_wrong_arguments(args, needle, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert needle in run_cli(args, capsys)


def test_config_with_unknown_option(tmp_path, capsys, tiny_st_dir):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("learning_rat: 0.1\n")
    msg = run_cli(
        [
            "finetune",
            "--model",
            tiny_st_dir,
            "--train-data",
            beir(tmp_path / "d"),
            "--output_dir",
            tmp_path / "o",
            "--config",
            cfg,
        ],
        capsys,
    )
    assert "unknown option(s) ['learning_rat']" in msg


def test_garbled_yaml_config(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("a: [unclosed\n")
    assert "not valid YAML" in run_cli(["recipe", "--config", cfg], capsys)


# --------------------------------------------------------------------------------------------- callbacks & API
def test_callbacks_used_wrongly():
    from hf_cocodr.finetuning import HardNegativeRefreshCallback, KMeansClusteringCallback

    with pytest.raises(RuntimeError, match="trainer is not set; use it through IDROTrainer"):
        KMeansClusteringCallback(num_clusters=3).cluster("test")
    with pytest.raises(ValueError, match="every_steps must be > 0"):
        HardNegativeRefreshCallback(every_steps=0)
    with pytest.raises(ValueError, match="top_k .* must be larger than skip_top"):
        HardNegativeRefreshCallback(every_steps=2, top_k=5, skip_top=5)
    with pytest.raises(ValueError, match="carry must be 'match' or 'reset'"):
        KMeansClusteringCallback(carry="keep")


def test_idro_loss_without_labels(tiny_st_dir):
    from sentence_transformers import SentenceTransformer

    from hf_cocodr import IDROLoss

    model = SentenceTransformer(str(tiny_st_dir))
    loss = IDROLoss(model, num_clusters=2)
    feats = [model.preprocess(["a query"]), model.preprocess(["a document"])]
    with pytest.raises(ValueError, match="needs cluster ids as labels; train it with IDROTrainer"):
        loss(feats, None)
    import torch

    with pytest.raises(ValueError, match=r"cluster ids must be in \[0, 2\)"):
        loss(feats, torch.tensor([5]))
