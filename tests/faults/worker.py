"""Runs ``hf-cocodr pretrain|finetune ...`` in this process, optionally SIGKILLing itself at a chosen moment.

    python worker.py KILL_MODE KILL_STEP -- <hf-cocodr arguments>

KILL_MODE: ``none``; ``step`` (inside the loss computation of optimizer step KILL_STEP, i.e. mid-step);
``save`` (inside the checkpoint save at step KILL_STEP, after the model files but before the trainer state);
``marker`` (the checkpoint of step KILL_STEP written, its completion marker not yet); ``final-card`` (inside the
KILL_STEP-th final save of a trainer in this process: its model files written, its card not yet); ``final-record``
(the KILL_STEP-th final save written, the owner record not yet told).
"""

import os
import signal
import sys

os.environ["HF_HUB_OFFLINE"] = "1"


def main():
    mode, step = sys.argv[1], int(sys.argv[2])
    args = sys.argv[sys.argv.index("--") + 1 :]
    from transformers import Trainer

    from hf_cocodr.finetuning.trainer import IDROTrainer
    from hf_cocodr.pretraining.trainer import CocoPretrainer

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    if mode == "step":
        for cls in (IDROTrainer, CocoPretrainer):
            original = cls.compute_loss

            def compute_loss(self, *a, _orig=original, **k):
                if self.state.global_step + 1 == step:
                    die()
                return _orig(self, *a, **k)

            cls.compute_loss = compute_loss
    elif mode == "save":
        original_rng = Trainer._save_rng_state

        def save_rng(self, output_dir):
            if self.state.global_step == step:
                die()  # the model files of this checkpoint are written, the trainer state and marker are not
            return original_rng(self, output_dir)

        Trainer._save_rng_state = save_rng
    elif mode == "marker":
        from hf_cocodr.trainer_common import TrainerMixin

        original_mark = TrainerMixin._mark_checkpoint_complete

        def mark(self, trial, _orig=original_mark):
            if self.state.global_step == step:
                die()
            return _orig(self, trial)

        TrainerMixin._mark_checkpoint_complete = mark
    elif mode in ("final-card", "final-record"):
        import hf_cocodr.export as export
        import hf_cocodr.finetuning.rows_trainer as rows_trainer
        from hf_cocodr.trainer_common import TrainerMixin

        saves = [0]
        if mode == "final-record":
            original_record = TrainerMixin._record_outputs

            def record(self, _orig=original_record):
                saves[0] += 1
                if saves[0] == step:
                    die()
                return _orig(self)

            TrainerMixin._record_outputs = record
        else:
            for module in (export, rows_trainer):  # (the card is written last in a save: the model files are there)
                original_card = module.write_model_card

                def card(folder, *a, _orig=original_card, **k):
                    if "checkpoint-" not in str(folder):
                        saves[0] += 1
                        if saves[0] == step:
                            die()
                    return _orig(folder, *a, **k)

                module.write_model_card = card
    from hf_cocodr.cli import main as cli_main

    sys.exit(cli_main(args))


if __name__ == "__main__":
    main()
