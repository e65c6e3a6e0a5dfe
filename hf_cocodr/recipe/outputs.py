"""What the recipe's stages write besides trainer output: completion markers, the WiSE-FT and soup models, the
final export and the fine-tuning's weight history."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from ..model_card import TRAINING_INFO_FILE, write_model_card
from ..modeling.loading import load_encoder
from ..run_record import LOCK, RECORD
from ..utils import atomic_directory, atomic_write_json

STAGE_MARKER = "hf_cocodr_stage.json"


def read_marker(path: Path, identity: str | None = None) -> dict | None:
    """The completion marker of the stage in ``path``; with ``identity``, only if the stage finished with those
    inputs."""
    marker = path / STAGE_MARKER
    if marker.is_file():
        try:
            info = json.loads(marker.read_text())
        except ValueError:
            return None
        return info if identity is None or info.get("identity") == identity else None
    return None


def write_marker(path: Path, info: dict) -> None:
    """Mark the stage in ``path`` finished (atomically): ``info`` holds its identity, steps, seconds, ..."""
    atomic_write_json(path / STAGE_MARKER, info)


def stopped(guard) -> dict[str, Any]:
    """The stage marker's note that a deadline ended the stage early (nothing when it ran all its steps)."""
    if guard is None or guard.stopped_at_step is None:
        return {}
    return {"stopped_by_deadline_at_step": guard.stopped_at_step}


def write_wise(start: str, adapted: str, stage_dir: Path, alpha: float, identity: str | None = None) -> None:
    """WiSE-FT of the last stage's model with the starting model, written as a complete model directory."""
    from ..modeling.wise import wise_ensemble
    from ..training_api import previous_training_info

    st = wise_ensemble(load_encoder(start), load_encoder(adapted), alpha)
    prev = previous_training_info(adapted)
    stage = {
        "type": "wise",
        "method": "wise-ft",
        "title": "WiSE-FT weight-space ensemble with the starting model",
        "alpha": alpha,
        "weights": f"{1 - alpha:g} x starting model + {alpha:g} x adapted model",
    }
    card = {
        "stages": list(prev.get("stages", [])) + [stage],
        "methods": list(dict.fromkeys(list(prev.get("methods", [])) + ["wise-ft"])),
        "datasets": list(prev.get("datasets", [])),
        "base_model": prev.get("base_model"),
    }
    with atomic_directory(stage_dir) as tmp:
        st.save(str(tmp))
        for name in (TRAINING_INFO_FILE,):
            if (Path(adapted) / name).is_file():
                shutil.copy2(Path(adapted) / name, tmp / name)
        write_model_card(tmp, st, card)
        write_marker(tmp, {"alpha": alpha, "start": start, "adapted": adapted, "identity": identity})


def write_soup(run_dirs: list[Path], stage_dir: Path, seeds: list[int]) -> None:
    """The uniform weight average of the COCO runs in ``run_dirs``, written to ``stage_dir`` as a complete model
    directory whose card lists the first run's stages and the soup."""
    from ..modeling.wise import soup
    from ..training_api import previous_training_info

    st = soup([load_encoder(str(d)) for d in run_dirs])
    prev = previous_training_info(str(run_dirs[0]))
    stage = {
        "type": "soup",
        "method": "model-soup",
        "title": f"uniform weight average (model soup) of {len(run_dirs)} COCO runs",
        "runs": len(run_dirs),
        "seeds": seeds,
        "weights": f"the mean of the {len(run_dirs)} runs' weights; each run as the COCO stage above, "
        "with its own seed",
    }
    card = {
        "stages": list(prev.get("stages", [])) + [stage],
        "methods": list(dict.fromkeys(list(prev.get("methods", [])) + ["model-soup"])),
        "datasets": list(prev.get("datasets", [])),
        "base_model": prev.get("base_model"),
    }
    with atomic_directory(stage_dir) as tmp:
        st.save(str(tmp))
        if (run_dirs[0] / TRAINING_INFO_FILE).is_file():
            shutil.copy2(run_dirs[0] / TRAINING_INFO_FILE, tmp / TRAINING_INFO_FILE)
        write_model_card(tmp, st, card)


def export_final(src: Path, dst: Path) -> None:
    """Copy the model files of the last stage (not its checkpoints) to ``dst``, atomically. Entries of ``dst`` that
    no earlier export wrote (the user's) are carried over (:func:`~hf_cocodr.utils.atomic_directory`'s
    ``keep_others``)."""
    skip = {"trainer_state.json", "training_args.bin", STAGE_MARKER, "eval.json", "idro_weights.json", RECORD, LOCK}
    with atomic_directory(dst, keep_others=True) as tmp:
        for p in src.iterdir():
            if p.name.startswith("checkpoint-") or p.name in skip or p.name.startswith("."):
                continue
            if p.is_dir():
                shutil.copytree(p, tmp / p.name)
            else:
                shutil.copy2(p, tmp / p.name)


def save_weight_history(trainer, out: Path) -> None:
    """The iDRO cluster weights, clusterings and log of a fine-tuning stage, in ``out/idro_weights.json``."""
    atomic_write_json(
        out / "idro_weights.json",
        {
            "weights": trainer.weight_history,
            "clusterings": trainer.kmeans_callback.history if trainer.kmeans_callback else [],
            "log_history": trainer.state.log_history,
        },
    )
