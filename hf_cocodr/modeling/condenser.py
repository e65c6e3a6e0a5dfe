"""CondenserForPretraining: a masked-LM backbone plus a Condenser head (Gao & Callan, 2021), as used by COCO.

The head is ``n_head_layers`` fresh transformer layers of the backbone's own layer class. Its input is the
final-layer CLS state followed by the layer-``skip_from`` states of tokens 1..L-1; its output goes through the
backbone's own (tied) MLM prediction head. Pretraining then forces the CLS vector to carry what the late
layers know about the sequence.

Head weights (and the MLM prediction head, so pretraining can be continued from an exported
sentence-transformers directory) are saved to ``condenser_head.safetensors`` with ``condenser_head.json``.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..utils import atomic_write_json, honour_umask

logger = logging.getLogger(__name__)

HEAD_WEIGHTS = "condenser_head.safetensors"
HEAD_CONFIG = "condenser_head.json"
_MLM_HEAD_ATTRS = ("cls", "lm_head", "generator_lm_head")


def default_skip_from(num_layers: int) -> int:
    """6 for 12-layer models (the paper), half the depth otherwise (3 for MiniLM-L6)."""
    return 6 if num_layers == 12 else max(1, num_layers // 2)


def _mlm_head(lm: nn.Module) -> tuple[str, nn.Module]:
    for attr in _MLM_HEAD_ATTRS:
        if isinstance(getattr(lm, attr, None), nn.Module):
            return attr, getattr(lm, attr)
    raise ValueError(f"{type(lm).__name__} has no MLM prediction head ({_MLM_HEAD_ATTRS}); use a *ForMaskedLM model")


def _checkpoint_keys(path: Path) -> set[str] | None:
    """Tensor names stored in a local checkpoint (safetensors, sharded or not), or None if unknown."""
    from safetensors import safe_open

    index = path / "model.safetensors.index.json"
    if index.is_file():
        return set(json.loads(index.read_text())["weight_map"])
    single = path / "model.safetensors"
    if single.is_file():
        with safe_open(str(single), "pt") as f:
            return set(f.keys())
    return None


def _transformer_dir(path: str) -> str:
    """For a sentence-transformers directory, the folder holding the transformers checkpoint."""
    p = Path(path)
    modules = p / "modules.json"
    if modules.is_file():
        for m in json.loads(modules.read_text()):
            if m.get("type", "").endswith("Transformer"):
                return str(p / m.get("path", ""))
    return path


def checkpoint_has_mlm_head(path: str | os.PathLike) -> bool | None:
    """Whether a local checkpoint stores MLM prediction-head weights (None when it cannot be told)."""
    keys = _checkpoint_keys(Path(_transformer_dir(str(path))))
    if keys is None:
        return None
    return any(k.split(".")[0] in _MLM_HEAD_ATTRS for k in keys)


class CondenserForPretraining(nn.Module):
    """A ``*ForMaskedLM`` backbone with a Condenser head.

    Args:
        lm: the masked-LM backbone (e.g. ``BertForMaskedLM``); its encoder is what gets exported.
        n_head_layers: layers in the Condenser head (2 in the paper).
        skip_from: backbone layer whose token states feed the head (must be < the backbone's depth).
    """

    def __init__(self, lm: nn.Module, n_head_layers: int = 2, skip_from: int | None = None):
        super().__init__()
        config = lm.config
        depth = config.num_hidden_layers
        if skip_from is None:
            skip_from = default_skip_from(depth)
        if not 0 < skip_from < depth:
            raise ValueError(
                f"skip_from={skip_from} must be between 1 and {depth - 1} (the backbone has {depth} layers); "
                f"the paper uses 6 for 12-layer models"
            )
        if n_head_layers < 1:
            raise ValueError(f"n_head_layers must be >= 1, got {n_head_layers}")
        self.lm = lm
        self.config = config
        self.skip_from = int(skip_from)
        self.n_head_layers = int(n_head_layers)
        base = getattr(lm, lm.base_model_prefix)
        layer_cls = type(base.encoder.layer[0])
        self.c_head = nn.ModuleList([layer_cls(config) for _ in range(n_head_layers)])
        self.c_head.apply(lm._init_weights)
        self._mlm_attr, _ = _mlm_head(lm)

    # ------------------------------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        n_head_layers: int | None = None,
        skip_from: int | None = None,
        trust_remote_code: bool = False,
        **kwargs,
    ) -> CondenserForPretraining:
        """Load from a sentence-transformers directory or a transformers checkpoint (with or without MLM head).

        A checkpoint without MLM head gets a fresh one tied to the word embeddings (logged); a directory with
        ``condenser_head.safetensors`` continues from that head, otherwise a fresh head is created (logged).
        """
        from transformers import AutoModelForMaskedLM

        src = _transformer_dir(str(path))
        head_cfg = {}
        head_file = Path(str(path)) / HEAD_WEIGHTS
        if (Path(str(path)) / HEAD_CONFIG).is_file():
            head_cfg = json.loads((Path(str(path)) / HEAD_CONFIG).read_text())
        lm = AutoModelForMaskedLM.from_pretrained(src, trust_remote_code=trust_remote_code, **kwargs)
        lm.tie_weights()
        keys = _checkpoint_keys(Path(src)) if Path(src).is_dir() else None
        attr, _ = _mlm_head(lm)
        has_mlm = keys is None or any(k.startswith(attr + ".") or k.startswith(attr) for k in keys)
        model = cls(
            lm,
            n_head_layers or head_cfg.get("n_head_layers", 2),
            skip_from if skip_from is not None else head_cfg.get("skip_from"),
        )
        if head_file.is_file():
            model.load_head(head_file, load_mlm_head=not has_mlm)
            logger.info(
                "Condenser head loaded from %s (%d layers, skip_from=%d)",
                head_file,
                model.n_head_layers,
                model.skip_from,
            )
        else:
            logger.warning(
                "no %s in %s: the Condenser head (%d layers, skip_from=%d) starts from random weights",
                HEAD_WEIGHTS,
                path,
                model.n_head_layers,
                model.skip_from,
            )
            if not has_mlm:
                logger.warning(
                    "%s has no MLM head: a fresh prediction head tied to the word embeddings was created "
                    "(its initial MLM loss is high until it is trained)",
                    path,
                )
        # One mode for the whole module, as transformers' from_pretrained gives (the loaded encoder is in eval mode,
        # the freshly built head would otherwise be in train mode); the Trainer switches to train mode per step.
        return model.eval()

    def head_state_dict(self) -> dict[str, Tensor]:
        state = {f"c_head.{k}": v for k, v in self.c_head.state_dict().items()}
        _, mlm = _mlm_head(self.lm)
        emb = self.lm.get_input_embeddings().weight
        for k, v in mlm.state_dict().items():
            if v.data_ptr() != emb.data_ptr():  # the tied decoder weight is the word embedding matrix
                state[f"mlm_head.{k}"] = v
        return {k: v.detach().contiguous().clone() for k, v in state.items()}

    def load_head(self, file: str | os.PathLike, load_mlm_head: bool = True) -> None:
        from safetensors.torch import load_file

        state = load_file(str(file))
        head = {k[len("c_head.") :]: v for k, v in state.items() if k.startswith("c_head.")}
        self.c_head.load_state_dict(head)
        if load_mlm_head:
            _, mlm = _mlm_head(self.lm)
            mlm_state = {k[len("mlm_head.") :]: v for k, v in state.items() if k.startswith("mlm_head.")}
            missing, unexpected = mlm.load_state_dict(mlm_state, strict=False)
            if unexpected:
                raise ValueError(f"{file}: unexpected MLM head tensors {unexpected}")
            self.lm.tie_weights()

    def save_head(self, directory: str | os.PathLike) -> None:
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".{HEAD_WEIGHTS}.tmp"
        save_file(self.head_state_dict(), str(tmp))
        honour_umask(tmp)  # safetensors writes 0600
        os.replace(tmp, directory / HEAD_WEIGHTS)
        atomic_write_json(directory / HEAD_CONFIG, self.head_config())

    def head_config(self) -> dict[str, Any]:
        return {
            "n_head_layers": self.n_head_layers,
            "skip_from": self.skip_from,
            "backbone_model_type": self.config.model_type,
            "hidden_size": self.config.hidden_size,
            "num_hidden_layers": self.config.num_hidden_layers,
            "format": "hf_cocodr.condenser_head.v1",
        }

    # ------------------------------------------------------------------------------------------ forward
    @property
    def encoder_model(self) -> nn.Module:
        """The backbone's base encoder (what is exported as the sentence-transformers model)."""
        return getattr(self.lm, self.lm.base_model_prefix)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        labels: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        pooling: str = "cls",
        detach_mlm_inputs: bool = False,
    ) -> dict[str, Tensor]:
        """Returns ``embedding`` (pooled final-layer state), and per-token MLM sums/counts for both heads.

        The MLM losses are returned as *sums* over masked tokens (``mlm_sum``, ``head_mlm_sum``) plus the count,
        so callers can normalise by a global count (gradient cache, DDP). ``detach_mlm_inputs`` stops the MLM
        gradients at the encoder's hidden states (the heads still learn): used to warm up a freshly created MLM
        head without letting its initially random gradients disturb the encoder.
        """
        kwargs = {"token_type_ids": token_type_ids} if token_type_ids is not None else {}
        out = self.encoder_model(
            input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, **kwargs
        )
        hidden = out.hidden_states
        last = hidden[-1]
        if pooling == "cls":
            emb = last[:, 0]
        else:
            m = attention_mask.unsqueeze(-1).to(last.dtype)
            emb = (last * m).sum(1) / m.sum(1).clamp(min=1)
        result = {"embedding": emb}
        if labels is not None:
            # MLM logits only at the masked positions (the other ~85% would be discarded anyway)
            sel = labels != -100
            targets = labels[sel]
            _, mlm = _mlm_head(self.lm)
            result["num_masked"] = sel.sum()
            feed_last = last.detach() if detach_mlm_inputs else last
            feed_skip = hidden[self.skip_from].detach() if detach_mlm_inputs else hidden[self.skip_from]
            result["mlm_sum"] = F.cross_entropy(mlm(feed_last[sel]).float(), targets, reduction="sum")
            x = torch.cat([feed_last[:, :1], feed_skip[:, 1:]], dim=1)
            ext = self._extended_mask(attention_mask, x.dtype)
            for layer in self.c_head:
                y = layer(x, ext)
                x = y[0] if isinstance(y, tuple) else y
            result["head_mlm_sum"] = F.cross_entropy(mlm(x[sel]).float(), targets, reduction="sum")
        return result

    @staticmethod
    def _extended_mask(mask: Tensor, dtype) -> Tensor:
        return (1.0 - mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min
