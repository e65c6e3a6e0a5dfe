"""What the recipe's stages write besides trainer output: completion markers, the WiSE-FT and soup models, the
final export and the fine-tuning's weight history; and the check that an earlier run in the output folder names no
retired lever (:func:`check_no_retired_levers`)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..model_card import TRAINING_INFO_FILE, write_model_card
from ..modeling.loading import load_encoder
from ..retired import RETIRED_OPTIONS, RETIRED_STAGES, refuse_retired, retired_message
from ..rundir.run_record import LOCK, RECORD
from ..utils import atomic_directory, atomic_write_json

STAGE_MARKER = "hf_cocodr_stage.json"


def read_marker(path: Path, identity: str | None = None) -> dict | None:
    """The completion marker of the stage in ``path``; with ``identity``, only if the stage finished with those
    inputs; None also where an output the marker lists is gone or has another size (:func:`lost_output`)."""
    info = read_json_marker(path)
    if not info or lost_output(path, info):
        return None
    return info if identity is None or info.get("identity") == identity else None


def read_json_marker(path: Path) -> dict:
    """The completion marker of the stage in ``path`` as it is written (``{}``: none, or not readable JSON)."""
    try:
        info = json.loads((path / STAGE_MARKER).read_text())
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def _outputs(path: Path) -> dict[str, int]:
    """``{relative path: size}`` of every file a stage wrote into ``path``: its model and records, not its
    checkpoints, logs (``runs``), hidden entries, owner record, lock or marker."""
    out = {}
    for here, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "checkpoint-")) and d != "runs")
        for name in files:
            f = Path(here) / name
            if name.startswith(".") or name in (STAGE_MARKER, RECORD, LOCK) or not f.is_file():
                continue
            out[f.relative_to(path).as_posix()] = f.stat().st_size
    return dict(sorted(out.items()))


def lost_output(path: Path, info: dict) -> str | None:
    """What of the outputs a stage's marker lists (``outputs``: each file and its size when the stage finished) is
    gone or changed size, in words (``None``: all there; a marker of an earlier version, without the list, is taken
    at its word)."""
    listed = info.get("outputs")
    if not isinstance(listed, dict):
        return None
    for name, size in listed.items():
        f = path / name
        if not f.is_file():
            return f"{f} is missing"
        if f.stat().st_size != size:
            return f"{f} has {f.stat().st_size} bytes, not the {size} it was written with"
    return None


def check_no_retired_levers(out: Path, resume: bool = True) -> None:
    """Refuse (``ConfigError``, one line naming it) to resume a run in ``out`` that an earlier version ran with a
    retired lever (:mod:`hf_cocodr.retired`): its ``recipe.json`` names a retired option at a value that acted, its
    ``plan.json`` gives a retired stage steps, or a retired stage's folder is there. Resumed, such a run would go on
    without the lever as if it had never been on; nothing to refuse where the run does not resume (it starts
    over)."""
    if not resume:
        return
    out = Path(out)
    record = _read_json(out / "recipe.json")
    config = record.get("config") if isinstance(record, dict) else None
    if isinstance(config, dict):
        refuse_retired({k: v for k, v in config.items() if k in RETIRED_OPTIONS}, f"{out / 'recipe.json'}: option ")
    plan = _read_json(out / "plan.json")
    for stage, option in RETIRED_STAGES.items():
        steps = plan.get(f"{stage}_steps") if isinstance(plan, dict) else None
        if isinstance(steps, int) and steps > 0:
            raise ConfigError(retired_message(option, f"{out / 'plan.json'}: {stage}_steps {steps} ({option})"))
        if (out / stage).is_dir():
            raise ConfigError(retired_message(option, f"{out / stage}: the stage of {option}"))


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None  # (a damaged record is read as none: the run's own checks say what they need of it)


def write_marker(path: Path, info: dict) -> None:
    """Mark the stage in ``path`` finished (atomically): ``info`` holds its identity, steps, seconds, ...; the marker
    also lists the stage's outputs as they are now (``outputs``: each file and its size), so that a finished stage
    is taken as finished only while its outputs are there (:func:`read_marker`)."""
    atomic_write_json(path / STAGE_MARKER, {**info, "outputs": _outputs(path)})


def stopped(guard) -> dict[str, Any]:
    """The stage marker's note that a deadline ended the stage early (nothing when it ran all its steps)."""
    if guard is None or guard.stopped_at_step is None:
        return {}
    return {"stopped_by_deadline_at_step": guard.stopped_at_step}


def write_wise(start: str, adapted: str, stage_dir: Path, alpha: float, identity: str | None = None) -> None:
    """WiSE-FT of the last stage's model with the starting model, written as a complete model directory."""
    from ..modeling.wise import wise_ensemble

    stage = {
        "type": "wise",
        "method": "wise-ft",
        "title": "WiSE-FT weight-space ensemble with the starting model",
        "alpha": alpha,
        "weights": f"{1 - alpha:g} x starting model + {alpha:g} x adapted model",
    }
    marker = {"alpha": alpha, "start": start, "adapted": adapted, "identity": identity}
    st = wise_ensemble(load_encoder(start), load_encoder(adapted), alpha)
    _write_combined(st, Path(adapted), stage_dir, stage, marker)


def write_soup(run_dirs: list[Path], stage_dir: Path, seeds: list[int]) -> None:
    """The uniform weight average of the COCO runs in ``run_dirs``, written to ``stage_dir`` as a complete model
    directory whose card lists the first run's stages and the soup."""
    from ..modeling.wise import soup

    stage = {
        "type": "soup",
        "method": "model-soup",
        "title": f"uniform weight average (model soup) of {len(run_dirs)} COCO runs",
        "runs": len(run_dirs),
        "seeds": seeds,
        "weights": f"the mean of the {len(run_dirs)} runs' weights; each run as the COCO stage above, "
        "with its own seed",
    }
    _write_combined(soup([load_encoder(str(d)) for d in run_dirs]), Path(run_dirs[0]), stage_dir, stage)


def _write_combined(st, source: Path, stage_dir: Path, stage: dict[str, Any], marker: dict | None = None) -> None:
    """Write ``st``, a model combined from others' weights, to ``stage_dir`` as a complete model directory, atomically:
    its card lists the stages of ``source`` (the model it continues) and then ``stage``, ``source``'s training record
    comes along, and ``marker`` (if given) marks the stage finished in the same step."""
    from ..training_api import previous_training_info

    prev = previous_training_info(str(source))
    card = {
        "stages": list(prev.get("stages", [])) + [stage],
        "methods": list(dict.fromkeys(list(prev.get("methods", [])) + [stage["method"]])),
        "datasets": list(prev.get("datasets", [])),
        "base_model": prev.get("base_model"),
    }
    with atomic_directory(stage_dir, keep_others=True) as tmp:  # (a user's entry in the folder stays)
        st.save(str(tmp))
        if (source / TRAINING_INFO_FILE).is_file():
            shutil.copy2(source / TRAINING_INFO_FILE, tmp / TRAINING_INFO_FILE)
        write_model_card(tmp, st, card)
        if marker is not None:
            write_marker(tmp, marker)


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
