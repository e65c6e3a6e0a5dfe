"""Worker for the torchrun tests of what the ranks agree on (test_ranks_agree.py); each rank records what it did in
``OUT/rank<r>.json`` (its exit code and what it printed to stderr).

torchrun ... rank_worker.py cli OUT RANK1_EXTRA_JSON -- ARGV...   the command line ARGV on every rank, rank 1's with
                                                                   RANK1_EXTRA_JSON's arguments appended
torchrun ... rank_worker.py checkpoint OUT MODEL_DIR BEIR_DIR      one COCO step and its checkpoint, rank 1
                                                                   writing its random state a second late
"""

import io
import json
import os
import signal
import sys
import time
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# (a rank that ends first makes torchrun stop the others: each rank here ends on its own, a moment later)
signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _cli(out: Path, extra: list[str], argv: list[str]) -> None:
    from hf_cocodr.cli import main

    rank = int(os.environ["RANK"])
    err, real = io.StringIO(), sys.stderr
    sys.stderr = err
    try:
        code = main(argv + (extra if rank == 1 else []))
    finally:
        sys.stderr = real
    (out / f"rank{rank}.json").write_text(json.dumps({"code": code, "stderr": err.getvalue()}))
    sys.exit(code)


def _checkpoint(out: Path, model_dir: str, beir: str) -> None:
    from transformers import Trainer

    from hf_cocodr import CocoPretrainer, CocoPretrainingArguments

    rank = int(os.environ["RANK"])
    if rank == 1:
        real = Trainer._save_rng_state

        def late(self, output_dir):
            time.sleep(1.5)
            real(self, output_dir)

        Trainer._save_rng_state = late
    steps = {"max_steps": 1, "save_steps": 1, "per_device_train_batch_size": 4, "seed": 3}
    quiet = {"use_cpu": True, "report_to": "none", "disable_tqdm": True, "dataloader_drop_last": True}
    args = CocoPretrainingArguments(output_dir=str(out / "run"), **steps, **quiet)
    CocoPretrainer(model_dir, args, corpora=[beir]).train()
    (out / f"rank{rank}.json").write_text(json.dumps({"code": 0}))


if __name__ == "__main__":
    mode, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    if mode == "cli":
        _cli(out, json.loads(sys.argv[3]), sys.argv[sys.argv.index("--") + 1 :])
    else:
        _checkpoint(out, sys.argv[3], sys.argv[4])
