"""Behaviour shared by the two trainers (resume, checkpoint markers, Hub pushes)."""

from __future__ import annotations

import logging

from .hub import push_directory, validate_repo_id

logger = logging.getLogger(__name__)


class TrainerMixin:
    """Behaviour shared by CocoPretrainer and IDROTrainer: resumable ``train()``, complete-checkpoint markers and
    ``push_to_hub=True``.

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

    def train(self, resume_from_checkpoint=None, **kwargs):
        """``trainer.train()``; ``resume_from_checkpoint=True`` picks the latest *complete* checkpoint. With
        ``push_to_hub=True`` the finalised output directory is pushed in one commit at the end."""
        from .checkpoints import resolve_resume

        resume_from_checkpoint = resolve_resume(resume_from_checkpoint, self.args.output_dir)
        self._finalized = False
        output = super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)
        if self.args.push_to_hub:
            self.push_to_hub()
        return output

    def _mark_checkpoint_complete(self, trial) -> None:
        """Written last, atomically: only checkpoints with this marker are ever resumed from."""
        import os

        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        from . import distributed as D
        from .state import COMPLETE_MARKER
        from .utils import atomic_write_json

        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        if self.args.should_save:
            atomic_write_json(os.path.join(folder, COMPLETE_MARKER), {"global_step": self.state.global_step})
        D.barrier()

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
