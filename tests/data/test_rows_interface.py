"""Training rows a method builds reach IDROTrainer through the rows interface and the Method hooks: the trainer
and the negatives refresh find a grouped training set's labelled rows and their row group by asking, not by the
attribute names one method happens to use."""

from __future__ import annotations

from hf_cocodr import IDROTrainer, IDROTrainingArguments, RetrievalTrainingData, load_encoder
from hf_cocodr.data.training import RowsSource
from hf_cocodr.methods.base import Method


class Labelled(RowsSource):
    """A grouped training set whose labelled rows live under a name of its own (``labelled``)."""

    negatives_group = "labelled"

    def __init__(self, inner: RetrievalTrainingData):
        self.labelled = inner
        self.query_texts, self.name = inner.query_texts, f"labelled({inner.name})"

    @property
    def negatives_source(self) -> str:
        return self.labelled.negatives_source

    def __len__(self) -> int:
        return len(self.labelled)

    def sample(self, rows, *, step: int, seed: int, num_negatives: int):
        return self.labelled.sample(rows, step=step, seed=seed, num_negatives=num_negatives)

    def negatives_table(self) -> RetrievalTrainingData:
        return self.labelled

    def state_tensors(self):
        return self.labelled.state_tensors()

    def load_state_tensors(self, tensors, source) -> None:
        self.labelled.load_state_tensors(tensors, source)


class GroupRecorder(Method):
    """Records the row groups the trainer asks the model to encode as."""

    name = "group-recorder"

    def __init__(self):
        super().__init__()
        self.groups: list[str] = []

    def use_row_group(self, trainer, group: str) -> None:
        self.groups.append(group)


def test_a_negatives_refresh_mines_the_labelled_rows_a_grouped_set_declares(tiny_st_dir, tiny_beir, tmp_path):
    inner = RetrievalTrainingData.from_beir(tiny_beir, "train", negatives="bm25")
    args = IDROTrainingArguments(
        output_dir=str(tmp_path / "o"),
        per_device_train_batch_size=4,
        max_steps=2,
        num_clusters=2,
        refresh_negatives_every_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        logging_steps=1,
        num_negatives=1,
    )
    trainer = IDROTrainer(model=load_encoder(str(tiny_st_dir)), args=args, train_dataset=Labelled(inner))
    recorder = GroupRecorder()
    trainer.add_method(recorder)
    assert trainer._num_negatives == 1  # the labelled rows have a negatives table: rows sample their negatives
    trainer.train()
    assert inner.negatives_source == "self-mined@1"  # the refresh mined the labelled rows
    assert recorder.groups == ["labelled"]  # encoded as their group, through the method hook
    assert trainer.negatives_callback.history[0]["step"] == 1
