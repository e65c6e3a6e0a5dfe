"""Pushing a finished model directory to the Hugging Face Hub: encoder, Condenser head, card and results together.

The push is one commit. Only the model's files go up (training checkpoints, optimizer states and logs stay local).
The token comes from the usual Hugging Face sources (``HF_TOKEN``, ``huggingface-cli login``) or the ``token``
argument; it is never written to a file, a card or a log line. The local directory is only read.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from .errors import HubPushError  # raised here; defined with the other input errors (re-exported)
from .utils import hub_id_problem

logger = logging.getLogger(__name__)

# Never uploaded: training state that is large, private or pickled.
IGNORE_PATTERNS = [
    "checkpoint-*", "checkpoint-*/**", "runs/**", "*.pt", "*.pth", "*.bin.tmp", "training_args.bin", ".*", "**/.*",
    "rng_state*", "optimizer*", "scheduler*", "hf_cocodr_state.*", "hf_cocodr_checkpoint_complete.json",
]




def validate_repo_id(repo_id: str) -> None:
    """Raise ``ValueError`` unless ``repo_id`` is a valid ``org/name`` Hub repository id."""
    problem = hub_id_problem(repo_id)
    if problem:
        raise ValueError(f"repository id {repo_id!r} is not valid: {problem}")


def check_push_possible(repo_id: str | None, token: str | None = None) -> None:
    """Before any training with ``push_to_hub``: a valid ``org/name``, the Hub not switched off (``HF_HUB_OFFLINE``)
    and a token to push with, so the push cannot fail for these reasons after the work is done."""
    from huggingface_hub import constants

    if not repo_id:
        raise ValueError("push_to_hub=True needs hub_model_id='org/name'")
    validate_repo_id(repo_id)
    if constants.is_offline_mode():
        raise HubPushError(f"push_to_hub to {repo_id} needs the Hub, but offline mode is on (HF_HUB_OFFLINE=1); unset "
                           "it, or train without --push_to_hub and run `hf-cocodr push` afterwards")
    if not (token or _current_token()):
        raise HubPushError(f"push_to_hub to {repo_id} needs a Hugging Face token: set HF_TOKEN, run `hf auth login` "
                           "or pass --hub_token")


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
