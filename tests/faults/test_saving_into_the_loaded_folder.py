"""Saving into the folder a model was loaded from never corrupts it (issue 66, item 9): safetensors zero-filled a
file saved over the path it was memory-mapped from. hf_cocodr writes every model into a staging sibling renamed into
place, so the mapped file is never written: an export of a loaded model into its own folder, the recipe's WiSE-FT
written over the folder of the model it reads, and ``hf-cocodr export SRC SRC`` (refused in one line, whatever the
spelling) all leave the weights intact."""

from __future__ import annotations

import hashlib
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from hf_cocodr.cli import main
from hf_cocodr.export import export_sentence_transformer
from hf_cocodr.modeling.loading import load_encoder
from hf_cocodr.recipe.outputs import write_wise


def digest(folder) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_exporting_a_loaded_model_into_its_own_folder_keeps_its_weights(tiny_st_dir, tmp_path):
    folder = tmp_path / "served model"
    shutil.copytree(tiny_st_dir, folder)
    before = load_file(str(folder / "model.safetensors"))
    model = load_encoder(str(folder))  # (its weights may be mapped from folder/model.safetensors)
    export_sentence_transformer(model, folder, pooling="mean", similarity="cosine")
    after = load_file(str(folder / "model.safetensors"))
    assert before.keys() == after.keys()
    for name, value in before.items():
        assert torch.equal(value, after[name]), name
    assert any(value.abs().sum() > 0 for value in after.values())


def test_wise_written_over_the_folder_it_reads_is_the_interpolation(tiny_st_dir, tmp_path):
    adapted = tmp_path / "adapted"
    shutil.copytree(tiny_st_dir, adapted)
    start = load_file(str(tiny_st_dir / "model.safetensors"))
    moved = {name: value + 0.125 if value.is_floating_point() else value for name, value in start.items()}
    save_file(moved, str(adapted / "model.safetensors"))
    write_wise(str(tiny_st_dir), str(adapted), adapted, 0.25)
    written = load_file(str(adapted / "model.safetensors"))
    assert written.keys() == start.keys()
    for name, value in start.items():
        if value.is_floating_point():
            torch.testing.assert_close(written[name], 0.75 * value + 0.25 * moved[name], msg=name)


@pytest.mark.parametrize("spelling", ["same", "dot-dot", "link"])
def test_export_src_src_is_refused_in_one_line_and_changes_nothing(spelling, tiny_st_dir, tmp_path, capsys):
    src = tmp_path / "ckpt"
    shutil.copytree(tiny_st_dir, src)
    before = digest(src)
    dest = {"same": src, "dot-dot": src / "1_Pooling" / "..", "link": tmp_path / "alias"}[spelling]
    if spelling == "link":
        dest.symlink_to(src, target_is_directory=True)
    assert main(["export", str(src), str(dest)]) == 2
    err = capsys.readouterr().err.strip()
    # (a link is refused as a link, whatever it points at: no write goes through one)
    said = "is a symbolic link" if spelling == "link" else "the model is read from"
    assert len(err.splitlines()) == 1 and said in err, err
    assert digest(src) == before
