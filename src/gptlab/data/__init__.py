"""Data: corpora → token shards on disk (``prepare``), and shards → batches (``WindowSampler``).

sources.py   the files of a corpus: found, sized, checksummed; JSONL and parquet records
pieces.py    a corpus cut into pieces (a file and an offset) that any process reads by itself
corpus.py    built-in corpora (an offline default, an optional download)
prepare.py   tokenize into ``train.bin``/``val.bin`` (or numbered shards) + ``meta.json`` + ``tokenizer.json``
workers.py   a pool of tokenizer processes that read their own pieces; results come back in order
shards.py    ``ShardWriter`` (numbered shard files) and ``ShardedTokens`` (shards read as one array)
dataset.py   ``TokenDataset``: a prepared directory read back as memmaps
sampler.py   ``WindowSampler`` (training, exact resume) and ``eval_batches``
chat.py      chat / alpaca records → rows of tokens with a loss mask and example boundaries
"""

from gptlab.data.chat import ChatOptions, prepare_alpaca, prepare_chat
from gptlab.data.dataset import DATASET_FORMAT, EOT, META_FILE, SPLITS, TOKENIZER_FILE, TokenDataset
from gptlab.data.pieces import count_documents, iter_chunks
from gptlab.data.prepare import build_tokenizer, prepare, token_dtype
from gptlab.data.sampler import WindowSampler, eval_batches, eval_windows, n_eval_batches
from gptlab.data.sources import describe_sources, find_sources

__all__ = [
    "ChatOptions",
    "prepare_alpaca",
    "prepare_chat",
    "DATASET_FORMAT",
    "EOT",
    "META_FILE",
    "SPLITS",
    "TOKENIZER_FILE",
    "TokenDataset",
    "WindowSampler",
    "build_tokenizer",
    "count_documents",
    "describe_sources",
    "eval_batches",
    "eval_windows",
    "find_sources",
    "iter_chunks",
    "n_eval_batches",
    "prepare",
    "token_dtype",
]
