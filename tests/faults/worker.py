"""Runs ``hf-cocodr pretrain|finetune ...`` in this process, optionally SIGKILLing itself at a chosen moment.

    python worker.py KILL_MODE KILL_STEP -- <hf-cocodr arguments>

KILL_MODE: ``none``; ``step`` (inside the loss computation of optimizer step KILL_STEP, i.e. mid-step);
``save`` (inside the checkpoint save at step KILL_STEP, after the model files but before the trainer state).
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
    from hf_cocodr.cli import main as cli_main

    sys.exit(cli_main(args))


if __name__ == "__main__":
    main()
