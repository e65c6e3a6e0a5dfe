"""Pushing a finished model directory to the Hugging Face Hub: encoder, Condenser head, card and results together.

The push is one commit. Only the model's files go up (training checkpoints, optimizer states and logs stay local).
The token comes from the usual Hugging Face sources (``HF_TOKEN``, ``huggingface-cli login``) or the ``token``
argument; it is never written to a file, a card or a log line. The local directory is only read.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

# Never uploaded: training state that is large, private or pickled.
IGNORE_PATTERNS = [
    "checkpoint-*", "checkpoint-*/**", "runs/**", "*.pt", "*.pth", "*.bin.tmp", "training_args.bin", ".*", "**/.*",
    "rng_state*", "optimizer*", "scheduler*", "hf_cocodr_state.*", "hf_cocodr_checkpoint_complete.json",
]


class HubPushError(RuntimeError):
    """A push failed; the message says why (status, repository) and the local directory is untouched."""


def validate_repo_id(repo_id: str) -> None:
    from huggingface_hub.utils import HFValidationError
    from huggingface_hub.utils import validate_repo_id as _validate

    if not isinstance(repo_id, str) or repo_id.count("/") != 1:
        raise ValueError(f"repository id {repo_id!r} must look like 'org/name'")
    try:
        _validate(repo_id)
    except HFValidationError as e:
        raise ValueError(f"repository id {repo_id!r} is not valid: {e}") from None


def _redact(text: str, token: str | None) -> str:
    return text.replace(token, "***") if token else text


def push_directory(
    model_dir: str | os.PathLike,
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    commit_message: str | None = None,
    token: str | None = None,
) -> str:
    """Upload a model directory to ``repo_id`` in one commit; returns the commit URL.

    Args:
        model_dir: a sentence-transformers directory (``modules.json``) written by hf_cocodr or any other tool.
        repo_id: ``org/name``.
        private: create the repository as private (an existing repository keeps its visibility).
        revision: a branch to push to (created from ``main`` if missing).
        commit_message: default ``"Upload <name> with hf_cocodr"``.
        token: a Hub token; default: the usual Hugging Face sources.
    """
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    validate_repo_id(repo_id)
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model directory {model_dir} not found")
    if not (model_dir / "modules.json").is_file():
        raise ValueError(f"{model_dir} is not a sentence-transformers directory (no modules.json); "
                         "export it first with `hf-cocodr export` or `hf-cocodr convert`")
    api = HfApi(token=token)
    tok = token or _current_token()
    message = commit_message or f"Upload {model_dir.name} with hf_cocodr"
    try:
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        if revision and revision != "main":
            api.create_branch(repo_id, branch=revision, exist_ok=True, repo_type="model")
        info = api.upload_folder(repo_id=repo_id, folder_path=str(model_dir), revision=revision,
                                 commit_message=message, ignore_patterns=IGNORE_PATTERNS, repo_type="model")
    except HfHubHTTPError as e:
        status = getattr(getattr(e, "response", None), "status_code", None)
        raise HubPushError(_redact(f"push of {model_dir} to {repo_id} failed (HTTP {status}): "
                                   f"{str(e).splitlines()[0]}; nothing local was changed", tok)) from None
    except OSError as e:  # connection refused, DNS, timeouts
        raise HubPushError(_redact(f"push of {model_dir} to {repo_id} failed: cannot reach the Hub ({e}); "
                                   "nothing local was changed", tok)) from None
    url = getattr(info, "commit_url", None) or str(info)
    logger.info("pushed %s to %s%s: %s", model_dir, repo_id, f"@{revision}" if revision else "", url)
    return url


def _current_token() -> str | None:
    try:
        from huggingface_hub import get_token

        return get_token()
    except Exception:  # pragma: no cover
        return None


class HubPushMixin:
    """Trainer behaviour shared by CocoPretrainer and IDROTrainer for ``push_to_hub=True``.

    * ``hub_model_id`` is required and validated before anything runs.
    * The token given as ``hub_token`` is taken out of the arguments (transformers pickles them into
      ``training_args.bin``) and only handed to the Hub client.
    * Checkpoints stay local; after training, the finalised directory (encoder, head, card, results) is pushed in one
      commit.
    """

    _hub_token: str | None = None

    @staticmethod
    def _prepare_hub_args(args) -> str | None:
        token = args.hub_token
        args.hub_token = None
        if args.push_to_hub:
            from .errors import ConfigError

            if not args.hub_model_id:
                raise ConfigError("push_to_hub=True needs hub_model_id='org/name'")
            validate_repo_id(args.hub_model_id)
        return token

    def init_hf_repo(self, token: str | None = None, private: bool | None = None) -> None:
        super().init_hf_repo(token=token or self._hub_token, private=private)

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        logger.info("push_to_hub: checkpoints stay local; the final model is pushed in one commit after training")

    def push_to_hub(self, commit_message: str | None = None, blocking: bool = True, token: str | None = None,
                    revision: str | None = None, **kwargs) -> str:
        """Push the finalised output directory to ``args.hub_model_id`` in one commit; returns the commit URL."""
        self.finalize()
        if not self.args.should_save:
            return ""
        return push_directory(self.args.output_dir, self.args.hub_model_id, private=bool(self.args.hub_private_repo),
                              revision=revision or getattr(self.args, "hub_revision", None),
                              commit_message=commit_message, token=token or self._hub_token)
