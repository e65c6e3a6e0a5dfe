"""Tiny, fully offline building blocks for tests: a WordPiece tokenizer, a 2-layer BERT, a synthetic BEIR folder.

Imported by ``conftest.py`` and by worker scripts launched with ``torchrun`` (which add this folder to sys.path).
"""

from __future__ import annotations

import itertools
import json
import random
import re
from pathlib import Path

import numpy as np

TOPICS = {
    "heart": "cardiac artery blood pressure vessel pulse cholesterol statin infarction rhythm",
    "brain": "neuron cortex memory synapse cognition dementia signal hippocampus plasticity stroke",
    "plant": "leaf photosynthesis chlorophyll root soil seed growth nitrogen flower pollen",
    "ocean": "wave salt coral reef tide current plankton whale fish marine",
    "space": "planet orbit star galaxy telescope comet gravity rocket moon asteroid",
    "music": "melody rhythm chord guitar piano song tempo harmony concert violin",
    "code": "compiler function variable loop python bug memory thread kernel cache",
    "food": "bread cheese tomato pasta spice recipe oven butter sugar flavor",
}
FILLER = "the a of and in to is was for with on by as at from this that which are were be".split()


def sentence(rng: random.Random, topic: str, n: int | None = None) -> str:
    words = TOPICS[topic].split()
    n = n or rng.randint(6, 12)
    out = [rng.choice(words) if rng.random() < 0.6 else rng.choice(FILLER) for _ in range(n)]
    return " ".join(out).capitalize() + "."


def document(rng: random.Random, topic: str, n_sent: int | None = None) -> str:
    return " ".join(sentence(rng, topic) for _ in range(n_sent or rng.randint(3, 6)))


def training_lines(n: int = 400, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [document(rng, rng.choice(sorted(TOPICS)), 2) for _ in range(n)]


def make_tokenizer(out_dir: str | Path, vocab_size: int = 400):
    """A BERT WordPiece tokenizer over :func:`training_lines`, the same ids in every process: its vocabulary is the
    special tokens, every character alone and as a ``##`` continuation, then the words by count (ties by spelling)
    up to ``vocab_size`` (the tokenizers library's trainer breaks ties in a per-process hash order)."""
    from collections import Counter

    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import BertTokenizerFast

    normalizer = normalizers.BertNormalizer(lowercase=True)
    pre = pre_tokenizers.BertPreTokenizer()
    counts: Counter[str] = Counter()
    for line in training_lines():
        counts.update(w for w, _ in pre.pre_tokenize_str(normalizer.normalize_str(line)))
    chars = sorted({c for w in counts for c in w})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *(f"##{c}" for c in chars)]
    words = sorted((w for w in counts if w not in set(vocab)), key=lambda w: (-counts[w], w))
    vocab += words[: max(0, vocab_size - len(vocab))]
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    fast = BertTokenizerFast(tokenizer_object=tok, do_lower_case=True, model_max_length=128)
    fast.save_pretrained(out_dir)
    return fast


def make_tiny_bert(
    out_dir: str | Path,
    *,
    layers: int = 2,
    hidden: int = 32,
    seed: int = 0,
    mlm: bool = True,
    dropout: float = 0.1,
    initializer_range: float = 0.02,
) -> Path:
    """A random BERT (MLM head optional) with its tokenizer, saved as a raw transformers checkpoint."""
    import torch
    from transformers import BertConfig, BertForMaskedLM, BertModel

    out_dir = Path(out_dir)
    tok = make_tokenizer(out_dir)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=hidden * 2,
        max_position_embeddings=128,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        type_vocab_size=2,
        initializer_range=initializer_range,
    )
    model = BertForMaskedLM(config) if mlm else BertModel(config, add_pooling_layer=False)
    model.save_pretrained(out_dir)
    return out_dir


def make_beir(
    out_dir: str | Path,
    *,
    n_docs: int = 80,
    n_queries: int = 40,
    seed: int = 0,
    splits=("train", "dev"),
    multi_positive: bool = False,
) -> Path:
    """A synthetic BEIR folder whose queries share words with their relevant documents."""
    rng = random.Random(seed)
    out_dir = Path(out_dir)
    (out_dir / "qrels").mkdir(parents=True, exist_ok=True)
    topics = sorted(TOPICS)
    docs = []
    for i in range(n_docs):
        t = topics[i % len(topics)]
        docs.append({"_id": f"d{i}", "title": f"{t} study {i}", "text": document(rng, t), "metadata": {}, "topic": t})
    with open(out_dir / "corpus.jsonl", "w") as f:
        for d in docs:
            f.write(json.dumps({k: v for k, v in d.items() if k != "topic"}) + "\n")
    queries, qrels = [], {s: [] for s in splits}
    for j in range(n_queries):
        d = docs[rng.randrange(n_docs)]
        words = d["text"].split()
        q = " ".join(rng.sample(words, min(5, len(words)))).lower()
        qid = f"q{j}"
        queries.append({"_id": qid, "text": q})
        split = splits[j % len(splits)]
        qrels[split].append((qid, d["_id"], 1))
        if multi_positive:
            same = [x for x in docs if x["topic"] == d["topic"] and x["_id"] != d["_id"]]
            for x in rng.sample(same, min(2, len(same))):
                qrels[split].append((qid, x["_id"], 1))
    with open(out_dir / "queries.jsonl", "w") as f:
        for q in queries:
            f.write(json.dumps(q) + "\n")
    for split, rows in qrels.items():
        with open(out_dir / "qrels" / f"{split}.tsv", "w") as f:
            f.write("query-id\tcorpus-id\tscore\n")
            for r in rows:
                f.write("\t".join(map(str, r)) + "\n")
    return out_dir


def stop_at(step: int):
    """A TrainerCallback that stops training after optimizer step ``step`` (to leave a checkpoint to resume)."""
    from transformers import TrainerCallback

    class StopAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == step:
                control.should_training_stop = True

    return StopAt()


def crash_at(monkeypatch, trainer_cls, step: int, message: str = "simulated crash"):
    """Make ``trainer_cls`` raise ``RuntimeError(message)`` when it starts optimizer step ``step + 1`` (a killed run
    whose latest checkpoint is the one saved before). Returns a function that undoes it."""
    original = trainer_cls.training_step

    def crash(self, *a, **k):
        if self.state.global_step == step:
            raise RuntimeError(message)
        return original(self, *a, **k)

    monkeypatch.setattr(trainer_cls, "training_step", crash)
    return lambda: monkeypatch.setattr(trainer_cls, "training_step", original)


def _parquet(rows: list[dict], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def _configs_card(configs: dict[str, dict[str, str]]) -> str:
    """A dataset card whose front matter declares ``configs`` (name -> split -> file pattern), as the Hub's cards do."""
    lines = ["---", "configs:"]
    for name, splits in configs.items():
        lines += [f"- config_name: {name}", "  data_files:"]
        lines += [f"  - split: {split}\n    path: {pattern}" for split, pattern in splits.items()]
    return "\n".join(lines + ["---", ""])


def hub_layouts(beir_dir: str | Path, root: str | Path) -> tuple[Path, Path]:
    """Copies of a BEIR folder laid out as its Hub repositories: ``root/mteb/<name>`` as mteb publishes them (configs
    ``corpus``, ``queries`` and ``default``, the qrels, one parquet file per split, as ``push_to_hub`` writes them)
    and ``root/BeIR/<name>`` (configs ``corpus`` and ``queries``, parquet) with ``root/BeIR/<name>-qrels`` (one TSV
    file per split, as BeIR's qrels repositories hold them). Returns the two dataset folders."""
    beir_dir, root = Path(beir_dir), Path(root)
    name = beir_dir.name
    corpus = [json.loads(line) for line in open(beir_dir / "corpus.jsonl") if line.strip()]
    corpus = [{"_id": d["_id"], "title": d.get("title", ""), "text": d["text"]} for d in corpus]
    queries = [{"_id": q["_id"], "text": q["text"]} for q in map(json.loads, open(beir_dir / "queries.jsonl"))]
    splits = sorted(p.stem for p in (beir_dir / "qrels").glob("*.tsv"))
    qrels = {}
    for split in splits:
        rows = [line.rstrip("\n").split("\t") for line in open(beir_dir / "qrels" / f"{split}.tsv")][1:]
        qrels[split] = [{"query-id": q, "corpus-id": d, "score": int(s)} for q, d, s in rows]
    mteb = root / "mteb" / name
    _parquet(corpus, mteb / "corpus" / "test-00000-of-00001.parquet")
    _parquet(queries, mteb / "queries" / "test-00000-of-00001.parquet")
    for split, rows in qrels.items():
        _parquet(rows, mteb / "data" / f"{split}-00000-of-00001.parquet")
    configs = {"corpus": {"test": "corpus/test-*"}, "queries": {"test": "queries/test-*"}}
    configs["default"] = {split: f"data/{split}-*" for split in splits}
    (mteb / "README.md").write_text(_configs_card(configs))
    beir = root / "BeIR" / name
    _parquet(corpus, beir / "corpus" / "corpus-00000-of-00001.parquet")
    _parquet(queries, beir / "queries" / "queries-00000-of-00001.parquet")
    (beir / "README.md").write_text(
        _configs_card({"corpus": {"corpus": "corpus/corpus-*"}, "queries": {"queries": "queries/queries-*"}})
    )
    beir_qrels = root / "BeIR" / f"{name}-qrels"
    beir_qrels.mkdir(parents=True)
    for split in splits:
        (beir_qrels / f"{split}.tsv").write_text((beir_dir / "qrels" / f"{split}.tsv").read_text())
    return mteb, beir


def synonym_toy():
    """48 documents, each about 3 of 8 concepts; each sentence names every concept of its document by a synonym
    no other sentence of the document uses (12 synonyms a concept): a sentence shares no content word with its
    rest, while a crop of it shares all of its words with its document."""
    rng = random.Random(0)
    synonyms = {c: [f"w{c}x{s}" for s in range(12)] for c in range(8)}
    concept = {w: c for c, ws in synonyms.items() for w in ws}
    mixes = list(itertools.combinations(range(8), 3))
    rng.shuffle(mixes)
    texts = []
    for mix in mixes[:48]:
        picked = {c: rng.sample(synonyms[c], 4) for c in mix}
        sentences = []
        for s in range(4):
            words = [picked[c][s] for c in mix] + ["the", "of", "and"]
            rng.shuffle(words)
            sentences.append(" ".join(words).capitalize() + ".")
        texts.append(" ".join(sentences))
    vocab = sorted(concept)

    def bag(texts, dim, index):
        out = np.zeros((len(texts), dim), np.float32)
        for i, t in enumerate(texts):
            for w in re.findall(r"\w+", t.lower()):
                if w in concept:
                    out[i, index(w)] += 1
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)

    lexical = lambda t: bag(t, len(vocab), vocab.index)  # noqa: E731  (its words)
    semantic = lambda t: bag(t, 8, concept.get)  # noqa: E731  (their meaning: synonyms are one)
    return texts, [f"d{i}" for i in range(48)], lexical, semantic
