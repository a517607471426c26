"""The tiny training run that the project's tests share."""

from distopt.project.gpt import GPTConfig
from distopt.project.loop import TrainConfig

TINY = TrainConfig(
    model=GPTConfig(vocab_size=8, seq_len=16, n_layer=1, n_head=2, d_model=16),
    order=1,
    branching=2,
    train_tokens=4096,
    batch_size=8,
    steps=30,
    warmup_steps=3,
    peak_lr=1e-2,
    eval_every=10,
    eval_batches=1,
    dtype="float32",
)
# spelled out here, not read from distopt.project.history: the tests check that module
HISTORY_KEYS = {"step", "loss", "grad_norm", "lr", "step_time", "val_step", "val_loss"}
