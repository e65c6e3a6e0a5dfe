"""No write ever goes through a symbolic link inside an output folder, at any depth (issue 66, item 1): a link where
hf_cocodr writes (``OUT/model``, ``OUT/queries``, a stage folder's module folder, ...) is refused in one line naming
it before any work, and the folder it points to is never moved aside, replaced or deleted. A folder hf_cocodr
replaces keeps what no list names as its own."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from hf_cocodr.utils import ENTRIES_FILE, atomic_directory

CONFIG = dict(
    pseudo_queries=0,
    guard="record",
    skip_coco=True,
    finetune_steps=2,
    skip_finetune=False,
    target_pairs="none",
    wise_alpha=None,
    corpus_pool=None,
    refreshes=0,
    finetune={"per_device_train_batch_size": 4, "num_clusters": 2, "save_steps": 2},
)


def tree(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def users_folder(root: Path) -> Path:
    folder = root / "my chapters"
    (folder / "figures").mkdir(parents=True)
    (folder / "draft.tex").write_text("\\section{Results}")
    (folder / "figures" / "f1.svg").write_text("<svg/>")
    return folder


@pytest.fixture(scope="module")
def finished_recipe(tiny_bert_dir, tiny_beir, tmp_path_factory) -> Path:
    from hf_cocodr import recipe as R

    out = tmp_path_factory.mktemp("recipe") / "out"
    R.run_recipe(str(tiny_bert_dir), [str(tiny_beir)], str(tiny_beir), out, config=CONFIG)
    return out


@pytest.mark.parametrize("where", ["model", "queries", "finetune/1_Pooling"])
def test_a_link_where_a_recipe_writes_is_refused_before_any_work(
    where, finished_recipe, tiny_bert_dir, tiny_beir, tmp_path, monkeypatch
):
    from hf_cocodr import recipe as R
    from hf_cocodr.recipe import runner

    out = tmp_path / "again"
    shutil.copytree(finished_recipe, out, symlinks=True)
    mine = users_folder(tmp_path)
    before = tree(mine)
    shutil.rmtree(out / where)
    (out / where).symlink_to(mine, target_is_directory=True)
    monkeypatch.setattr(runner, "_run_stages", lambda *a: pytest.fail("the run started"))
    with pytest.raises(FileExistsError) as e:
        R.run_recipe(str(tiny_bert_dir), [str(tiny_beir)], str(tiny_beir), out, config=CONFIG)
    message = str(e.value)
    assert "\n" not in message and str(out / where) in message and "symbolic link" in message
    assert tree(mine) == before and (out / where).is_symlink()


def test_a_linked_destination_is_never_replaced(tmp_path):
    mine = users_folder(tmp_path)
    before = tree(mine)
    link = tmp_path / "exported"
    link.symlink_to(mine, target_is_directory=True)
    for keep_others in (False, True):
        with pytest.raises(FileExistsError, match="exported is a symbolic link"):
            with atomic_directory(link, keep_others=keep_others) as tmp:
                (tmp / "model.safetensors").write_bytes(b"weights")
    assert tree(mine) == before and link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported", "my chapters"]  # nothing staged is left


def test_a_replaced_folder_without_a_list_of_our_entries_keeps_every_entry_it_does_not_write(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"old weights")
    (folder / "my notes.md").write_text("keep me")
    with atomic_directory(folder, keep_others=True) as tmp:
        (tmp / "model.safetensors").write_bytes(b"new weights")
    assert (folder / "model.safetensors").read_bytes() == b"new weights"
    assert (folder / "my notes.md").read_text() == "keep me"
    assert ENTRIES_FILE in {p.name for p in folder.iterdir()}


def test_wise_keeps_a_users_file_in_its_folder(tiny_st_dir, tmp_path):
    from hf_cocodr.recipe.outputs import write_wise

    stage = tmp_path / "wise"
    write_wise(str(tiny_st_dir), str(tiny_st_dir), stage, 0.3)
    (stage / "results by hand.csv").write_text("split,ndcg\ndev,0.41\n")
    write_wise(str(tiny_st_dir), str(tiny_st_dir), stage, 0.6)
    assert (stage / "results by hand.csv").read_text() == "split,ndcg\ndev,0.41\n"


def test_commands_that_replace_their_folder_refuse_a_linked_one_before_any_work(
    tiny_st_dir, tiny_beir, tmp_path, capsys
):
    from hf_cocodr.cli import main

    mine = users_folder(tmp_path)
    before = tree(mine)
    link = tmp_path / "published"
    link.symlink_to(mine, target_is_directory=True)
    for argv in (
        ["export", str(tiny_st_dir), str(link)],
        ["pretrain", "--model", str(tiny_st_dir), "--corpus", str(tiny_beir), "--output_dir", str(link), "--use_cpu"],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "symbolic link" in err and str(link) in err, argv
    assert tree(mine) == before and link.is_symlink()
