"""The levers retired from the library, and the commit where their code last lived (:data:`RETIRED_AT`).

A lever lives in the library while a default uses it or users need it; one that its studies found no better than the
default leaves (its report names :data:`RETIRED_AT`, so it can be revived from there). What names a retired lever is
never run as if it were not there: a recipe option or flag, a ``distill:`` field, an old run's ``recipe.json`` or
``plan.json`` or a checkpoint's saved state that names one at a value that acted gets a one-line error naming it
(:func:`retired_message`); at the value at which it did nothing (a default run's), it is ignored and said so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

RETIRED_AT = "123371a9ca5c017ea45ef09586cd2a3075201c7f"  # the last commit of hf_cocodr where their code lived


@dataclass(frozen=True)
class Retired:
    """One retired option.

    Attributes:
        what: what it did, in a few words (the message says it).
        default: its value in a default run (as the schedule resolved it); it did nothing there.
        inert: whether every value of it did nothing in a run where its lever was off (an option that only acts
            with another one, e.g. the target stage's share where ``target_pairs`` is ``none``).
    """

    what: str
    default: Any
    inert: bool = False


# recipe options (and their flags, ``--`` + the name with dashes)
RETIRED_OPTIONS: dict[str, Retired] = {
    "distill_swa": Retired("stochastic weight averaging of the distillation's last steps", 0.0),
    "distill_l2sp": Retired("the distillation's pull toward the starting weights (L2-SP)", 0.0),
    "distill_deep": Retired("the query side's candidates sampled below the teacher's top k", 0),
    "distill_deep_depth": Retired("the deepest teacher rank distill_deep sampled from", 200, inert=True),
    "distill_margin_weight": Retired("the distillation's Margin-MSE term", 0.0),
    "distill_corpus_weight": Retired("the query side's whole-corpus term", 0.0),
    "target_pairs": Retired("the target pseudo-pairs stage", "none"),
    "target_steps": Retired("the target pseudo-pairs stage's steps", None, inert=True),
    "target_schedule": Retired("the target pseudo pairs' joint schedule", "sequential", inert=True),
    "joint_weight": Retired("the weight of the joint target pseudo pairs", 1.0, inert=True),
    "target_share": Retired("the target pseudo-pairs stage's share of the budget", 0.0, inert=True),
    "target": Retired("the target pseudo-pairs stage's training arguments", {}, inert=True),
}
# fields of DistillationTrainingArguments (a ``distill:`` mapping's)
RETIRED_DISTILL_FIELDS: dict[str, Retired] = {
    **{
        name: RETIRED_OPTIONS[name]
        for name in ("distill_swa", "distill_l2sp", "distill_margin_weight", "distill_corpus_weight")
    },
    # the loss's own setting now (HybridDistillLoss(temperature=...)); the recipe trains at the model's default
    "distill_temperature": Retired("the distillation's student temperature, set in the recipe", None),
}
# the checkpoint state of retired callbacks (hf_cocodr.finetuning.checkpoint_state), by its name
RETIRED_STATE: dict[str, str] = {"swa": "distill_swa", "l2sp": "distill_l2sp"}
# the folders of retired stages in a recipe's output folder, with the option that ran them
RETIRED_STAGES: dict[str, str] = {"target": "target_pairs"}
# values an unresolved config held where the lever was off (the schedule resolved them to the default)
_UNRESOLVED_OFF = {"target_pairs": ("auto",)}


def retired_message(name: str, label: str | None = None, known: Mapping[str, Retired] = RETIRED_OPTIONS) -> str:
    """The one line that refuses ``name`` (a retired option of ``known``), as ``label`` names it (default: ``recipe
    option <name>``; e.g. ``--distill-swa``, ``OUT/recipe.json: recipe option distill_swa``)."""
    what = known[name].what
    return (
        f"{label or f'recipe option {name}'} is retired ({what}: no study found it better than the default); its "
        f"code last lived in hf_cocodr commit {RETIRED_AT[:12]}: remove it, or run that commit"
    )


def acted(name: str, value: Any, known: Mapping[str, Retired] = RETIRED_OPTIONS) -> bool:
    """Whether retired option ``name`` (of ``known``) at ``value`` changed what a run computed (else it was off)."""
    retired = known[name]
    if retired.inert:
        return False
    return value != retired.default and value not in _UNRESOLVED_OFF.get(name, ())


def refuse_retired(
    values: Mapping[str, Any], prefix: str = "recipe option ", known: Mapping[str, Retired] = RETIRED_OPTIONS
) -> list[str]:
    """Refuse (``ConfigError``) the first retired name of ``known`` in ``values`` whose value acted, named as
    ``prefix + name``; returns the retired names that did nothing (the caller ignores them and says so)."""
    found = [name for name in values if name in known]
    for name in found:
        if acted(name, values[name], known):
            raise ConfigError(retired_message(name, prefix + name, known))
    return found
