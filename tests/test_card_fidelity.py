"""Cards and MTEB metadata checked with the ecosystem's own clients: ``huggingface_hub`` parses the card (model-index,
datasets, base_model) and ``mteb``'s registry is the reference for a model it already knows (all-MiniLM-L6-v2).

The fine-tune is two steps of the bundled all-MiniLM-L6-v2 copy on the toy BEIR folder: its card must name the Hub
model the local copy came from, list every evaluation of the run in ``model-index`` and take its title from the
user's model name (``hub_model_id``).
"""

from __future__ import annotations

import datetime
import json
import shutil
from pathlib import Path

import pytest

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
NAME = "acme/minilm-toy"


@pytest.fixture(scope="module")
def finetuned(minilm_dir, tiny_beir, tmp_path_factory) -> Path:
    from hf_cocodr.finetuning import IDROTrainingArguments
    from hf_cocodr.training_api import run_finetune

    out = tmp_path_factory.mktemp("fidelity") / "minilm-toy"
    args = IDROTrainingArguments(
        output_dir=str(out),
        max_steps=2,
        per_device_train_batch_size=4,
        num_clusters=2,
        num_negatives=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=3,
        dataloader_drop_last=True,
        hub_model_id=NAME,
    )
    run_finetune(minilm_dir, tiny_beir, args=args, evals=[f"{tiny_beir}:dev", f"{tiny_beir}:train"])
    return out


def front_matter(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text().split("---\n", 2)[1])


def test_card_loads_with_huggingface_hub(finetuned):
    from huggingface_hub import ModelCard

    card = ModelCard.load(finetuned / "README.md")
    assert card.data.base_model == MINILM  # the bundled local copy resolves to its Hub id
    assert card.data.library_name == "sentence-transformers"
    assert card.text.lstrip().startswith(f"# {NAME}\n")  # the user's model name, not a folder name
    assert f'SentenceTransformer("{NAME}")' in card.text
    assert "cocodr" not in (card.data.tags or [])  # no COCO stage, not a COCO-DR base
    assert "yu2022cocodr" not in card.text


def test_model_index_holds_every_evaluation(finetuned):
    from huggingface_hub.repocard_data import model_index_to_eval_results

    evaluations = json.loads((finetuned / "eval.json").read_text())
    assert len(evaluations) == 2
    expected = {}
    for spec, metrics in evaluations.items():
        split = spec.rsplit(":", 1)[1]
        for key, value in metrics.items():
            if key.split("@")[0] in ("ndcg", "recall", "mrr", "map") and "@" in key:
                expected[("toy", split, key.replace("@", "_at_"))] = value
    assert ("toy", "dev", "ndcg_at_10") in expected and ("toy", "train", "recall_at_100") in expected
    name, results = model_index_to_eval_results(front_matter(finetuned / "README.md")["model-index"])
    assert name == NAME
    got = {(r.dataset_name, r.dataset_split, r.metric_type): r.metric_value for r in results}
    assert got == pytest.approx(expected)
    assert {r.task_type for r in results} == {"text-retrieval"}
    assert {r.metric_name for r in results if r.metric_type == "ndcg_at_10"} == {"nDCG@10"}


def test_mteb_results_enter_the_model_index(finetuned, tmp_path):
    from huggingface_hub import ModelCard

    from hf_cocodr import load_encoder
    from hf_cocodr.model_card import write_model_card

    d = tmp_path / "m"
    shutil.copytree(finetuned, d)
    rev = d / "mteb_results" / "results" / "acme__minilm-toy" / "abc"
    rev.mkdir(parents=True)
    (rev / "SciFact.json").write_text(
        json.dumps(
            {
                "task_name": "SciFact",
                "dataset_revision": "0123",
                "scores": {
                    "test": [{"hf_subset": "default", "main_score": 0.7, "ndcg_at_10": 0.7, "recall_at_100": 0.95}]
                },
            }
        )
    )
    (rev / "model_meta.json").write_text("{}")
    write_model_card(d, load_encoder(str(d)), {})
    card = ModelCard.load(d / "README.md")
    mteb_rows = [r for r in card.data.eval_results if r.source_name == "MTEB"]
    assert {(r.dataset_name, r.dataset_split, r.metric_type, r.metric_value) for r in mteb_rows} == {
        ("SciFact", "test", "ndcg_at_10", 0.7),
        ("SciFact", "test", "recall_at_100", 0.95),
    }
    assert {r.dataset_type for r in mteb_rows} == {"mteb/scifact"}  # the built-in task's Hub dataset
    assert {r.dataset_revision for r in mteb_rows} == {"0123"}
    ours = [r for r in card.data.eval_results if r.source_name == "hf-cocodr evaluate"]
    evaluations = json.loads((d / "eval.json").read_text())
    assert len(ours) == sum(len([k for k in m if "@" in k]) for m in evaluations.values())  # they stay


def test_datasets_are_only_hub_ids(finetuned, tiny_st_dir, tmp_path):
    from huggingface_hub import ModelCard
    from huggingface_hub.utils import validate_repo_id

    from hf_cocodr import load_encoder
    from hf_cocodr.model_card import write_model_card

    assert ModelCard.load(finetuned / "README.md").data.datasets is None  # the toy folder is local data
    assert "toy:train" in (finetuned / "README.md").read_text()  # ...described in the text instead
    d = tmp_path / "m"
    shutil.copytree(tiny_st_dir, d)
    stages = [{"type": "finetune", "method": "idro", "source_data": "squad-v1.1:train", "corpora": ["scifact"]}]
    write_model_card(
        d,
        load_encoder(str(d)),
        {
            "stages": stages,
            "datasets": ["squad-v1.1:train", "scifact", "allenai/scifact", str(tmp_path), "not a/valid id"],
        },
    )
    datasets = ModelCard.load(d / "README.md").data.datasets
    assert datasets == ["allenai/scifact"]
    for entry in datasets:
        validate_repo_id(entry)
        assert not Path(entry).exists()


def test_export_title_is_the_model_name_not_a_staging_folder(tiny_bert_dir, tmp_path):
    from huggingface_hub import ModelCard

    from hf_cocodr.export import convert_checkpoint, export_sentence_transformer

    export_sentence_transformer(str(tiny_bert_dir), tmp_path / "my-export")
    assert ModelCard.load(tmp_path / "my-export" / "README.md").text.lstrip().startswith("# my-export\n")
    export_sentence_transformer(str(tiny_bert_dir), tmp_path / "named", card_data={"model_name": "acme/named"})
    assert ModelCard.load(tmp_path / "named" / "README.md").text.lstrip().startswith("# acme/named\n")
    convert_checkpoint(str(tiny_bert_dir), tmp_path / "conv", name="acme/converted")
    assert ModelCard.load(tmp_path / "conv" / "README.md").text.lstrip().startswith("# acme/converted\n")


# ------------------------------------------------------------------------------------------------------ MTEB meta
def test_minilm_meta_matches_the_mteb_registry(minilm_dir):
    import mteb

    from hf_cocodr.evaluation.mteb import model_meta_for

    ref = mteb.get_model_meta(MINILM)
    meta = model_meta_for(minilm_dir, MINILM)
    assert meta.release_date == ref.release_date
    assert meta.citation == ref.citation
    assert meta.training_datasets == ref.training_datasets
    assert (meta.n_parameters, meta.embed_dim, meta.max_tokens) == (ref.n_parameters, ref.embed_dim, ref.max_tokens)
    assert meta.similarity_fn_name == ref.similarity_fn_name and meta.adapted_from is None
    # under another name, the same weights are adapted from the registry's model
    copy = model_meta_for(minilm_dir, "acme/minilm-copy")
    assert copy.adapted_from == MINILM and copy.citation == ref.citation and copy.release_date == ref.release_date


def test_adapted_minilm_meta_changes_only_what_adaptation_changed(finetuned):
    import mteb

    from hf_cocodr.evaluation.mteb import model_meta_for

    ref = mteb.get_model_meta(MINILM)
    meta = model_meta_for(finetuned, NAME, revision="abc123")
    assert meta.name == NAME and meta.revision == "abc123" and meta.adapted_from == MINILM
    assert meta.training_datasets == ref.training_datasets | {"toy"}  # the registry's data + what our stage read
    assert meta.citation == ref.citation  # not a COCO-DR model: no COCO-DR citation
    ours = datetime.date.fromtimestamp((finetuned / "model.safetensors").stat().st_mtime).isoformat()
    assert meta.release_date == ours != ref.release_date
    assert (meta.n_parameters, meta.embed_dim, meta.languages) == (ref.n_parameters, ref.embed_dim, ref.languages)
    assert meta.license == ref.license


def test_cocodr_citation_only_on_cocodr_models(tiny_st_dir, tmp_path):
    from hf_cocodr.evaluation.mteb import model_meta_for
    from hf_cocodr.provenance import PROVENANCE_FILE

    plain = model_meta_for(tiny_st_dir, "acme/plain")
    assert plain.citation is None or "yu2022cocodr" not in plain.citation
    for info in (
        {"stages": [{"type": "coco", "method": "coco", "corpora": ["toy"]}]},
        {"base_model": "OpenMatch/cocodr-base-msmarco", "stages": [{"type": "finetune", "method": "idro"}]},
    ):
        d = tmp_path / str(len(list(tmp_path.iterdir())))
        shutil.copytree(tiny_st_dir, d)
        (d / PROVENANCE_FILE).write_text(json.dumps(info))
        assert "yu2022cocodr" in model_meta_for(d, "acme/cocodr-tiny").citation
