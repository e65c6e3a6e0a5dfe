"""Behaviour shared by the trainers (resume, checkpoint markers, Hub pushes)."""

from __future__ import annotations

import logging
import os
import shutil

from .errors import ConfigError, disk_faults
from .hub import push_directory, validate_repo_id
from .rundir.checkpoints import is_complete, latest_complete_checkpoint, mark_complete, resolve_resume, rotate
from .rundir.run_record import TRAINER_ENTRIES, RunFolder, read_record
from .utils import honour_umask, preserved_rng_state  # noqa: F401  (re-exported)

logger = logging.getLogger(__name__)


class TrainerMixin:
    """Behaviour shared by CocoPretrainer and the row-based trainers (IDROTrainer, DistillationTrainer): resumable ``train()``, complete-checkpoint markers and
    ``push_to_hub=True``.

    * ``hub_model_id`` is required and validated before anything runs.
    * The token given as ``hub_token`` is taken out of the arguments (transformers pickles them into
      ``training_args.bin``) and only handed to the Hub client.
    * Checkpoints stay local (``hub_strategy`` is set to ``"end"``); after training, the finalised directory
      (encoder, head, card, results) is pushed in one commit.
    """

    _hub_token: str | None = None

    @staticmethod
    def _prepare_hub_args(args) -> str | None:
        token = args.hub_token
        args.hub_token = None
        if args.push_to_hub:
            from transformers.trainer_utils import HubStrategy

            if not args.hub_model_id:
                raise ConfigError("push_to_hub=True needs hub_model_id='org/name'")
            validate_repo_id(args.hub_model_id)
            if args.hub_strategy != HubStrategy.END:
                logger.info(
                    "push_to_hub: hub_strategy %s -> end (checkpoints stay local; the final model is pushed in "
                    "one commit after training)",
                    getattr(args.hub_strategy, "value", args.hub_strategy),
                )
            args.hub_strategy = HubStrategy.END  # Trainer._push_from_checkpoint then pushes nothing
        return token

    _command = "train"  # the command name in the output folder's owner record

    def _run_identity(self) -> dict:
        """What makes a run this run: the starting model, the data and the settings that change the trajectory."""
        raise NotImplementedError

    def _trajectory_settings(self) -> dict:
        skip = (
            "output_dir",
            "overwrite_output_dir",
            "logging",
            "log_",
            "save_",
            "report_to",
            "disable_tqdm",
            "run_name",
            "hub_",
            "push_to_hub",
            "eval",
            "per_device_eval",
            "dataloader_num_workers",
            "dataloader_pin",
            "dataloader_persistent",
            "dataloader_prefetch",
            "resume_from_checkpoint",
            "load_best",
            "metric_for_best",
            "greater_is_better",
            "do_",
            "prediction_loss_only",
            "include_",
            "ddp_",
            "local_rank",
            "use_cpu",
            "no_cuda",
            "project",
            "trackio",
            "restore_callback",
        )
        return {k: v for k, v in self.args.to_dict().items() if not k.startswith(skip)}

    def _claim_output_dir(self, resume: bool):
        """Claim ``output_dir`` for this run (owner record + lock, see :mod:`hf_cocodr.rundir.run_record`); main process
        only. Returns the run id every process resumes under."""
        from . import distributed as D

        # (torchrun: a rank given other settings would wait for ever in a step the others never take)
        D.same_settings(self._trajectory_settings(), "training arguments")
        self._run_folder = None
        if self.args.should_save:
            self._run_folder = RunFolder.claim(
                self.args.output_dir,
                self._command,
                self._run_identity(),
                resume=resume,
                overwrite=bool(getattr(self.args, "overwrite_output_dir", False)),
                trainer=True,
            )
        D.barrier()
        return (read_record(self.args.output_dir) or {}).get("run_id")

    def train(self, resume_from_checkpoint=None, **kwargs):
        """``trainer.train()``; ``resume_from_checkpoint=True`` picks the latest *complete, intact* checkpoint of this
        run. The output folder is claimed first: a folder of someone else's files, another run's folder or one
        another process writes is refused (``overwrite_output_dir=True`` replaces an earlier run's own files). With
        ``push_to_hub=True`` the finalised output directory is pushed in one commit at the end. A save that fails
        because of the disk (full, read-only, ...) raises one ``OSError`` naming ``output_dir`` (see
        :func:`hf_cocodr.errors.disk_faults`)."""

        wants_resume = not (
            resume_from_checkpoint is None
            or resume_from_checkpoint is False
            or (isinstance(resume_from_checkpoint, str) and resume_from_checkpoint.lower() in ("", "false", "no", "0"))
        )
        run_id = self._claim_output_dir(wants_resume)
        try:
            resume_from_checkpoint = resolve_resume(resume_from_checkpoint, self.args.output_dir, run_id=run_id)
            self._finalized = False
            try:
                with disk_faults(self.args.output_dir):  # a checkpoint save on a full disk: one OSError naming it
                    output = super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)
            except OSError:
                self._remove_unfinished_checkpoint()
                raise
        finally:
            if self._run_folder is not None:
                self._run_folder.release()
        if self.args.push_to_hub:
            self.push_to_hub()
        return output

    def _remove_unfinished_checkpoint(self) -> None:
        """After a save failed (a full disk, ...): remove the checkpoint folder of the current step if it has no
        completion marker. It is this run's own, never resumed from, and frees the space it took."""
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        if not self.args.should_save:
            return
        folder = os.path.join(self.args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        if os.path.isdir(folder) and not is_complete(folder):
            shutil.rmtree(folder, ignore_errors=True)
            logger.warning("removed the unfinished checkpoint %s", folder)

    def _init_training_state(
        self, max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial
    ) -> tuple[int, int]:
        """The Trainer's restore of ``(epochs_trained, steps_trained_in_current_epoch)``, with a resume from a
        checkpoint at (or past) ``max_steps`` counted as every epoch done: no step is trained, and the model,
        optimizer and state stay the checkpoint's; only the end-of-training work (final save, card, state) runs.

        The Trainer resumes in epoch ``global_step // steps_per_epoch`` and checks the step limit only after each
        step, so a final checkpoint that ends inside an epoch would otherwise train one step past ``max_steps``."""
        epochs_trained, steps_in_epoch = super()._init_training_state(
            max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial
        )
        if resume_from_checkpoint is not None and max_steps > 0 and self.state.global_step >= max_steps:
            logger.info(
                "the checkpoint %s is at step %d of %d: nothing left to train",
                resume_from_checkpoint,
                self.state.global_step,
                max_steps,
            )
            return num_train_epochs, 0
        return epochs_trained, steps_in_epoch

    def evaluate(self, *args, **kwargs) -> dict[str, float]:
        """``trainer.evaluate()`` without side effects on training: the random states (Python, NumPy, torch CPU and
        CUDA) are restored afterwards, so the evaluation's data loader and evaluators do not change the dropout or
        sampling of the steps that follow; a run with evaluation trains exactly as the same run without."""
        with preserved_rng_state():
            return super().evaluate(*args, **kwargs)

    def _own_record(self) -> RunFolder | None:
        """This run's owner record of ``output_dir`` as it is on disk now (None on a process that does not save, or
        where the folder holds another run's record)."""
        run = getattr(self, "_run_folder", None)
        if run is None or not self.args.should_save:
            return None
        rec = read_record(run.path)
        return RunFolder(run.path, rec) if rec and rec.get("run_id") == run.run_id else None

    def _declare_outputs(self, names=None) -> None:
        """Before a write into ``output_dir`` outside a checkpoint (the final model, the evaluation files): declare
        in the owner record the entries it may write (``names``; default: those a training command writes,
        :data:`~hf_cocodr.rundir.run_record.TRAINER_ENTRIES`, and the entries of the latest complete checkpoint,
        which the final save writes again). A run killed during the write still owns what it wrote: the re-run
        resumes and writes it again, never taking it for the user's. :meth:`_record_outputs` then lists what was
        written and drops the declaration of what was not."""
        run = self._own_record()
        if run is None:
            return
        if names is None:
            names = set(TRAINER_ENTRIES)
            latest = latest_complete_checkpoint(run.path, run.run_id)
            if latest is not None:
                names |= {p.name for p in latest.iterdir()}
        run.expect(names)

    def _record_outputs(self) -> None:
        """List what this run wrote into ``output_dir`` in its owner record (after the final model is written); the
        entries declared for that write (:meth:`_declare_outputs`) that it did not write are no longer claimed."""
        run = self._own_record()
        if run is not None:
            run.save()
            run.record["expected"] = sorted(set(run.record.get("expected", [])) & set(run.record["files"]))
            run.save()
            # the model files the Trainer's savers wrote (safetensors leaves 0600) get the umask's modes
            honour_umask(*(run.path / name for name in run.record["files"]))

    def _save_checkpoint(self, model, trial):
        """The Trainer's checkpoint save, then its completion marker, then the removal of older checkpoints beyond
        ``save_total_limit``: the Trainer removes them before the new checkpoint is complete, so a kill or a full disk
        between the two left no complete checkpoint to resume from. Only complete checkpoints count towards the limit;
        the newest complete ones (and the best one) are kept."""
        limit = self.args.save_total_limit
        self.args.save_total_limit = None  # (the Trainer's own rotation, which runs before the marker, is off)
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self.args.save_total_limit = limit
        self._mark_checkpoint_complete(trial)
        if self.args.should_save:
            rotate(self._get_output_dir(trial=trial), limit, keep=self.state.best_model_checkpoint)

    def _mark_checkpoint_complete(self, trial) -> None:
        """Written last, atomically, once every rank has written its files (under ``torch.distributed`` each writes
        its own random state): only checkpoints with this marker are ever resumed from."""
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        from . import distributed as D

        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        D.barrier()  # (rank 0 marks the checkpoint complete only after the other ranks' files are there)
        if self.args.should_save:
            run = getattr(self, "_run_folder", None)
            mark_complete(folder, self.state.global_step, run.run_id if run else None, D.world()[0])
            if run is not None:
                run.save()
        D.barrier()

    def init_hf_repo(self, token: str | None = None, private: bool | None = None) -> None:
        super().init_hf_repo(token=token or self._hub_token, private=private)

    def push_to_hub(
        self,
        commit_message: str | None = None,
        blocking: bool = True,
        token: str | None = None,
        revision: str | None = None,
        **kwargs,
    ) -> str:
        """Push the finalised output directory to ``args.hub_model_id`` in one commit; returns the commit URL."""
        # Not Trainer.push_to_hub: its create_model_card step rewrites README.md (measured on a finished COCO folder:
        # our 3,750-character card became transformers' 1,075-character generic one), and it neither takes the token
        # we keep out of the arguments nor turns a failed push into one redacted line (hub.push_directory does).
        self.finalize()
        if not self.args.should_save:
            return ""
        return push_directory(
            self.args.output_dir,
            self.args.hub_model_id,
            private=bool(self.args.hub_private_repo),
            revision=revision or getattr(self.args, "hub_revision", None),
            commit_message=commit_message,
            token=token or self._hub_token,
        )
