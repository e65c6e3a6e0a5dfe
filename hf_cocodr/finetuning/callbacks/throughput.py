"""ThroughputMeter: the texts and tokens a trainer's steps encode, per second, and (on CUDA) how busy the GPU was.

The meter counts what the steps feed the model, not a re-computation from the data: a forward pre-hook on the word
embeddings of each base transformer of the trained model (``BertModel`` inside a SentenceTransformer or inside COCO's
Condenser; the embedding module is called as a module whichever way the transformer itself is called) adds up, for
every forward in training mode between the start and the end of an optimizer step, the texts (rows of the
``input_ids`` it embeds), the tokens (those that are not the model's padding token) and the padded tokens
(``input_ids.numel()``). Forwards in evaluation mode (the K-Means and negative refreshes encode in it) are not
counted. The token count stays on the model's device until training ends, so counting adds no host synchronisation
to a step.

The seconds are those from the start of the first step to the end of training (the device synchronised first):
what the loop did in between (checkpoints, logging, refreshes) is part of the cost. :class:`GpuUtilization` samples
the GPU's utilisation in a thread over the same time.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from typing import Any

import torch
from transformers import PreTrainedModel, TrainerCallback

logger = logging.getLogger(__name__)

SAMPLE_EVERY_S = 0.5  # seconds between two readings of the GPU's utilisation


def _nvidia_smi(index: int) -> float | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", f"--id={index}"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout
        return float(out.strip().splitlines()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def gpu_utilization_reader(device=None):
    """A function returning the utilisation (percent) of the CUDA ``device`` now, or None where none can be read
    (no CUDA device; neither NVML through ``torch.cuda.utilization`` nor ``nvidia-smi`` answers)."""
    if not torch.cuda.is_available():
        return None
    device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        torch.cuda.utilization(index)

        def read() -> float | None:
            return float(torch.cuda.utilization(index))

        return read
    except Exception:  # noqa: BLE001 (no NVML bindings: pynvml / amdsmi missing, or NVML refused)
        pass
    if _nvidia_smi(index) is None:
        return None
    return lambda: _nvidia_smi(index)


class GpuUtilization:
    """Samples a GPU's utilisation every ``every`` seconds in a thread between :meth:`start` and :meth:`stop`.

    Args:
        read: returns the utilisation in percent now (None: no reading); see :func:`gpu_utilization_reader`.
        every: seconds between two readings.
    """

    def __init__(self, read, every: float = SAMPLE_EVERY_S):
        self.read, self.every = read, every
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> GpuUtilization:
        if self.read is None or self._thread is not None:
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpu-utilization", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            value = self.read()
            if value is not None:
                self.samples.append(value)

    def stop(self) -> GpuUtilization:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        return self

    def summary(self) -> dict[str, Any]:
        """``{"gpu_utilization_mean", "gpu_utilization_max", "gpu_utilization_samples"}`` (empty without samples)."""
        if not self.samples:
            return {}
        return {
            "gpu_utilization_mean": round(sum(self.samples) / len(self.samples), 1),
            "gpu_utilization_max": round(max(self.samples), 1),
            "gpu_utilization_samples": len(self.samples),
        }


def _base_models(model) -> list[torch.nn.Module]:
    """The base transformers of ``model`` (modules that are their own ``base_model``): what receives the tokens."""
    return [m for m in model.modules() if isinstance(m, PreTrainedModel) and m.base_model is m]


class ThroughputMeter(TrainerCallback):
    """Texts, tokens and padded tokens the training steps encode, per second, and the GPU's utilisation while they
    ran (see the module docstring). :meth:`summary` is the record; several ``train()`` calls (a resumed run, the runs
    of a soup) add up.

    Args:
        clock: the clock (``time.perf_counter``).
        sample_gpu: whether to sample the GPU's utilisation (on CUDA only).
        skip_steps: optimizer steps of each ``train()`` not counted (a benchmark's warm-up), 0 in the recipe.
    """

    def __init__(self, clock=time.perf_counter, sample_gpu: bool = True, skip_steps: int = 0):
        self.clock, self.sample_gpu, self.skip_steps = clock, sample_gpu, int(skip_steps)
        self._skipped = 0
        self.steps = self.texts = self.padded_tokens = 0
        self.seconds = 0.0
        self.gpu_samples: list[float] = []
        self._tokens: torch.Tensor | None = None  # the token count, on the model's device until it is read
        self._counted_tokens = 0
        self._in_step = False
        self._t0: float | None = None
        self._hooks: list = []
        self._gpu: GpuUtilization | None = None
        self._device = None

    # ------------------------------------------------------------------------------------------------ counting
    def _hook(self, base) -> Any:
        pad = getattr(base.config, "pad_token_id", None)

        def count(module, args, kwargs) -> None:
            if not (self._in_step and module.training) or torch.is_inference_mode_enabled():
                return
            ids = kwargs.get("input", args[0] if args else None)
            if not isinstance(ids, torch.Tensor):
                return
            self.texts += int(ids.shape[0]) if ids.dim() > 1 else 1
            self.padded_tokens += int(ids.numel())
            n = (ids != pad).sum() if pad is not None else ids.new_tensor(ids.numel())
            self._tokens = n if self._tokens is None else self._tokens + n

        return base.get_input_embeddings().register_forward_pre_hook(count, with_kwargs=True)

    @property
    def tokens(self) -> int:
        """The tokens counted (not padding); reading it synchronises with the device."""
        if self._tokens is not None:
            self._counted_tokens += int(self._tokens)
            self._tokens = None
        return self._counted_tokens

    # ------------------------------------------------------------------------------------------------ events
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is not None and not self._hooks:
            self._hooks = [self._hook(m) for m in _base_models(model)]
            if not self._hooks:
                logger.warning("ThroughputMeter: the model has no transformers base model to count the tokens of")
        self._device = getattr(args, "device", None)

    def on_step_begin(self, args, state, control, **kwargs):
        if self._skipped < self.skip_steps:
            return
        if self._t0 is None:
            self._t0 = self.clock()
            if self.sample_gpu:
                self._gpu = GpuUtilization(gpu_utilization_reader(self._device)).start()
        self._in_step = True

    def on_step_end(self, args, state, control, **kwargs):
        if not self._in_step:  # a skipped step
            self._skipped += 1
            return
        self._in_step = False
        self.steps += 1

    def on_train_end(self, args, state, control, **kwargs):
        self._in_step, self._skipped = False, 0
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if self._t0 is None:  # no step ran
            return
        device = self._device
        if device is not None and getattr(device, "type", "") == "cuda" and torch.cuda.is_available():
            torch.cuda.synchronize(device)
        self.seconds += self.clock() - self._t0
        self._t0 = None
        if self._gpu is not None:
            self.gpu_samples += self._gpu.stop().samples
            self._gpu = None

    # ------------------------------------------------------------------------------------------------ record
    def summary(self) -> dict[str, Any]:
        """``steps``, ``texts``, ``tokens``, ``padded_tokens``, ``seconds``, ``texts_per_s``, ``tokens_per_s``, and
        on CUDA ``gpu_utilization_mean`` / ``_max`` / ``_samples`` (percent)."""
        seconds = round(self.seconds, 3)  # (the rates are those of the recorded seconds)
        record: dict[str, Any] = {
            "steps": self.steps,
            "texts": self.texts,
            "tokens": self.tokens,
            "padded_tokens": self.padded_tokens,
            "seconds": seconds,
            "texts_per_s": round(self.texts / seconds, 2) if seconds > 0 else None,
            "tokens_per_s": round(self.tokens / seconds, 2) if seconds > 0 else None,
        }
        gpu = GpuUtilization(None)
        gpu.samples = self.gpu_samples
        return {**record, **gpu.summary()}
