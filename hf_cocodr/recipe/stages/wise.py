"""The WiSE-FT stage: the weights ``(1 − α)·θ_start + α·θ_adapted`` of the starting and the adapted model. It trains
no step; its setting (:class:`WiseSettings`) is a recipe option."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...errors import ConfigError
from ..outputs import write_wise
from ..settings import AUTO, Auto, check_number, option
from ..stage import Cost, Stage

if TYPE_CHECKING:
    from ..config import RecipeConfig
    from ..context import RecipeRun


@dataclass
class WiseSettings:
    """WiSE-FT's option (``wise_alpha``)."""

    wise_alpha: float | Auto | None = option(
        AUTO,
        "WiSE-FT: final weights = (1-a) x start + a x adapted (of a query-side model: its query route), a in (0, 1]; "
        "'none' or 1 to skip",
    )

    def check(self) -> None:
        """Refuse an α outside (0, 1]: at 0 the final weights would be the starting model's, every stage's training
        discarded while the card says the model was adapted."""
        check_number(self, "wise_alpha", 0, 1, allow_none=True)
        if self.wise_alpha == 0:
            raise ConfigError(
                "recipe option wise_alpha must be a number in (0, 1], 1 or none to skip WiSE-FT, got 0: the final "
                "weights would be the starting model's and every stage's training discarded"
            )

    def uses_wise(self) -> bool:
        """Whether the recipe ends with a WiSE-FT interpolation (α of None or 1 means none)."""
        return self.wise_alpha not in (None, 1, 1.0)


class WiseStage(Stage):
    """WiSE-FT: the weights ``(1 − α)·θ_start + α·θ_adapted`` of the starting and the adapted model."""

    name = "wise"
    title = "WiSE-FT"
    settings = WiseSettings
    trains = False
    after_adaptation = True  # nothing adapted: nothing to interpolate

    def enabled(self, cfg: RecipeConfig) -> bool:
        return WiseSettings.uses_wise(cfg)

    def cost(self, throughput: dict[str, float], cfg: RecipeConfig, **kw: Any) -> Cost:
        """No step: a model load + export where it interpolates."""
        return Cost(loads=int(WiseSettings.uses_wise(cfg)))

    def identity(self, run: RecipeRun, start: str) -> dict[str, Any]:
        return {"stage": "wise", "start": run.fps["model"], "adapted": start, "alpha": run.cfg.wise_alpha}

    def train(self, run: RecipeRun) -> dict[str, Any] | None:
        from ...distributed import is_main

        if is_main():  # (under torch.distributed rank 0 writes the run's files)
            write_wise(run.model, run.current, run.dir(self.name), float(run.cfg.wise_alpha), run.ids[self.name])
        return None  # the marker is written with the model, in one atomic step
