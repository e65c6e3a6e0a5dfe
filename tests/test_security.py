"""Security: no remote code unless asked, safetensors/JSON for our own state, tokens never on disk, safe paths."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from hf_cocodr.cli import main

# Files written by transformers' Trainer itself (torch.save); everything else in our outputs is ours.
TRANSFORMERS_OWNED = {"optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin", "scaler.pt"}
PICKLE_MAGIC = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05", b"PK\x03\x04")  # pickle, or torch.save zip


def remote_code_checkpoint(root: Path) -> Path:
    root.mkdir(parents=True)
    marker = root / "EXECUTED"
    (root / "configuration_evil.py").write_text(
        f"open({str(marker)!r}, 'w').write('pwned')\n"
        "from transformers import PretrainedConfig\nclass EvilConfig(PretrainedConfig):\n    model_type = 'evil'\n"
    )
    (root / "config.json").write_text(
        json.dumps(
            {
                "model_type": "evil",
                "auto_map": {
                    "AutoConfig": "configuration_evil.EvilConfig",
                    "AutoModel": "configuration_evil.EvilConfig",
                },
            }
        )
    )
    # weights beside it, as a real checkpoint has (the loader's check for weights comes first and must not be what
    # refuses it)
    save_file({"w": np.zeros(2, np.float32)}, str(root / "model.safetensors"))
    return root


def test_remote_code_is_never_run_unless_asked(tmp_path, capsys):
    from hf_cocodr import load_encoder
    from hf_cocodr.modeling.condenser import CondenserForPretraining

    ckpt = remote_code_checkpoint(tmp_path / "evil")
    with pytest.raises(Exception, match="trust_remote_code"):
        load_encoder(str(ckpt))
    with pytest.raises(Exception, match="trust_remote_code"):
        CondenserForPretraining.from_pretrained(ckpt)
    assert main(["evaluate", str(ckpt), str(tmp_path), "--split", "x"]) == 2
    assert not (ckpt / "EXECUTED").exists()


def test_own_state_is_safetensors_and_json(tiny_bert_dir, tiny_beir, tmp_path):
    from safetensors import safe_open

    args = ["--max_steps", "2", "--save_steps", "2", "--per_device_train_batch_size", "8", "--use_cpu"]
    assert (
        main(
            [
                "pretrain",
                "--model",
                str(tiny_bert_dir),
                "--corpus",
                str(tiny_beir),
                "--output_dir",
                str(tmp_path / "coco"),
                *args,
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "finetune",
                "--model",
                str(tmp_path / "coco"),
                "--train-data",
                str(tiny_beir),
                "--output_dir",
                str(tmp_path / "ft"),
                "--num-clusters",
                "2",
                *args,
            ]
        )
        == 0
    )
    checked = 0
    for out in (tmp_path / "coco", tmp_path / "ft"):
        for p in out.rglob("*"):
            if not p.is_file() or p.name in TRANSFORMERS_OWNED:
                continue
            head = p.read_bytes()[:4]
            assert not head.startswith(PICKLE_MAGIC), f"{p} looks like a pickle / torch.save file"
            if p.suffix == ".safetensors":
                with safe_open(str(p), "pt") as f:
                    assert list(f.keys())
            elif p.suffix == ".json":
                json.loads(p.read_text())
            checked += 1
    assert checked > 20
    assert (tmp_path / "ft" / "checkpoint-2" / "hf_cocodr_state.safetensors").is_file()
    # the span cache is .npz without object arrays (loads with allow_pickle=False)
    import os

    cache = Path(os.environ["HF_COCODR_CACHE"]) / "spans"
    for npz in cache.glob("*.npz"):
        with np.load(npz, allow_pickle=False) as z:
            assert set(z.files) == {"doc_span_ptr", "span_tok_ptr", "tokens", "doc_source"}


def test_hub_token_never_written(tiny_st_dir, tiny_beir, tmp_path, capsys):
    token = "hf_NeverWriteThis0123456789abcdefABCDEF"
    rc = main(
        [
            "finetune",
            "--model",
            str(tiny_st_dir),
            "--train-data",
            str(tiny_beir),
            "--output_dir",
            str(tmp_path / "ft"),
            "--num-clusters",
            "2",
            "--max_steps",
            "2",
            "--save_steps",
            "1",
            "--per_device_train_batch_size",
            "8",
            "--use_cpu",
            "--hub_token",
            token,
        ]
    )
    assert rc == 0
    out = capsys.readouterr()
    assert token not in out.out and token not in out.err
    for p in (tmp_path / "ft").rglob("*"):
        if p.is_file():
            assert token.encode() not in p.read_bytes(), p  # training_args.bin included


def test_config_paths_cannot_escape_output_dir(tiny_st_dir, tiny_beir, tmp_path, capsys):
    from hf_cocodr.cli.training import _check_config_paths
    from hf_cocodr.errors import ConfigError  # noqa: F401  (the recipe raises it)

    with pytest.raises(Exception, match="outside"):
        _check_config_paths({"report_dir": str(tmp_path / "elsewhere")}, str(tmp_path / "ft"))
    _check_config_paths({"report_dir": "logs"}, str(tmp_path / "ft"))  # relative: inside output_dir
    cfg = tmp_path / "c.yaml"
    cfg.write_text("coco:\n  output_dir: ../../somewhere\n")
    rc = main(
        [
            "recipe",
            "--model",
            str(tiny_st_dir),
            "--source-data",
            str(tiny_beir),
            "--output_dir",
            str(tmp_path / "r"),
            "--config",
            str(cfg),
        ]
    )
    assert rc == 2
    assert "places every stage inside --output_dir" in capsys.readouterr().err
    assert not (tmp_path / "elsewhere").exists()


def test_resolve_inside():
    from hf_cocodr.utils import resolve_inside

    assert resolve_inside("/tmp/out", "logs").as_posix() == str(Path("/tmp/out/logs").resolve())
    for bad in ("../x", "/etc/passwd", "logs/../../x"):
        with pytest.raises(ValueError, match="outside"):
            resolve_inside("/tmp/out", bad)


def test_a_hub_token_in_a_recipe_stage_mapping_reaches_no_file(tiny_bert_dir, tiny_beir, tmp_path, caplog):
    """A token given where options are copied (a recipe --config stage mapping) is in no record, card or log line."""
    import logging

    from hf_cocodr.recipe import run_recipe

    token = "hf_" + "Q7x" * 12
    out = tmp_path / "run"
    with caplog.at_level(logging.INFO):
        run_recipe(
            str(tiny_bert_dir),
            [str(tiny_beir)],
            str(tiny_beir),
            out,
            config={
                "skip_coco": True,
                "finetune_steps": 1,
                "corpus_pool": None,
                "save_hybrid": False,
                "finetune": {"hub_token": token, "per_device_train_batch_size": 8, "num_clusters": 2},
            },
        )
    leaked = [p for p in out.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
    assert not leaked, leaked
    assert token not in caplog.text
    record = json.loads((out / "recipe.json").read_text())
    assert record["config"]["finetune"]["hub_token"] == "<redacted>"


def test_a_token_shaped_string_is_taken_out_of_every_log_line(capsys):
    import logging

    from hf_cocodr.utils import setup_logging

    setup_logging()
    token = "hf_" + "Zk4" * 12
    logging.getLogger("hf_cocodr.somewhere").warning("pushing with %s to %s", token, "me/model")
    err = capsys.readouterr().err
    assert token not in err and "pushing with <redacted> to me/model" in err
