"""Worker for the 2-process DDP tests: trains a tiny model for a few steps and dumps what must match.

torchrun --nproc_per_node 2 worker.py {idro|methods|coco} MODEL_DIR BEIR_DIR OUT_DIR PER_DEVICE_BATCH [extra]
python worker.py ... (single process with the doubled batch)
"""

import json
import os
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import TrainerCallback  # noqa: E402


def main():
    mode, model_dir, beir, out, batch = sys.argv[1:6]
    extra = sys.argv[6] if len(sys.argv) > 6 else ""
    batch = int(batch)
    rank = int(os.environ.get("RANK", 0))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    common = dict(
        output_dir=str(out / "run"),
        per_device_train_batch_size=batch,
        max_steps=2,
        use_cpu=True,
        seed=5,
        save_strategy="no",
        report_to="none",
        logging_steps=1,
        dataloader_drop_last=True,
        disable_tqdm=True,
        learning_rate=1e-2,
        warmup_steps=0,
        optim="sgd",
        weight_decay=0.0,
    )
    # SGD: the update is lr x gradient, so equal updates mean equal gradients (Adam would amplify float noise
    # in near-zero gradients to +-lr)
    record = {"steps": {}}
    if mode in ("idro", "methods"):
        from hf_cocodr import IDROTrainer, IDROTrainingArguments, RetrievalTrainingData, load_encoder

        args = IDROTrainingArguments(**common, num_clusters=3, idro_tau=20.0)
        torch.manual_seed(0)
        model = load_encoder(model_dir)
        data = RetrievalTrainingData.from_beir(beir, "train", negatives="bm25")
        if mode == "methods":  # MoDIR + RMSC: classifier, queue and token combinations must agree across ranks
            from hf_cocodr.methods import configure_methods

            loss, data, setup = configure_methods(["modir", "rmsc"], model, args, data, None, [beir])
            trainer = IDROTrainer(model=model, args=args, train_dataset=data, loss=loss)
            setup(trainer)
            record["combinations"] = {}
            orig = trainer.materialize

            def materialize(rows):
                step = trainer.state.global_step + 1
                record["combinations"][step] = trainer.training_data.combination(rows.cpu().numpy())
                return orig(rows)

            trainer.materialize = materialize
        else:
            trainer = IDROTrainer(model=model, args=args, train_dataset=data)

        class Spy(TrainerCallback):
            def on_step_end(self, a, state, control, **kw):
                s = trainer.idro_loss.last_stats
                record["steps"][state.global_step] = {
                    "weights": trainer.idro_loss.weights.tolist(),
                    "cluster_ids": s["cluster_ids"].tolist(),
                    "cluster_losses": s["cluster_losses"].tolist(),
                    "grad_gram": s["grad_gram"].tolist(),
                }

        trainer.add_callback(Spy())
        record["assignments"] = None
    else:
        from hf_cocodr import CocoPretrainer, CocoPretrainingArguments

        args = CocoPretrainingArguments(**common, gradient_cache_chunk_size=int(extra or 0))
        torch.manual_seed(0)
        trainer = CocoPretrainer(model_dir, args, corpora=[beir])
    record["world_size"] = args.world_size
    record["env_world_size"] = int(os.environ.get("WORLD_SIZE", 1))
    trainer.train()
    if mode in ("idro", "methods"):
        record["assignments"] = trainer.cluster_ids.tolist()
    if mode == "methods":
        modir = trainer.idro_loss.auxiliary[0]
        record["modir_classifier"] = modir.classifier.tolist()
        record["modir_queue_rows"] = [len(d) for _, d in modir.queue]
    record["log"] = [h for h in trainer.state.log_history if "loss" in h]
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    params = {n: p.detach().contiguous().clone() for n, p in trainer.model.named_parameters()}
    save_file(params, str(out / f"params{rank}.safetensors"))


if __name__ == "__main__":
    main()
