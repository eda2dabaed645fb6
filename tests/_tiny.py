"""Settings shared by the training tests: a one-layer model that trains in milliseconds."""

TINY_TRAIN = [
    "model.n_layer=1",
    "model.n_embd=32",
    "model.n_head=2",
    "model.block_size=16",
    "threads=1",
    "progress=false",
    "eval_batches=2",
    "warmup_steps=2",
    "lr=3e-3",
]
