"""Data: corpora → token shards on disk (``prepare``), and shards → batches (``WindowSampler``).

sources.py   the files of a corpus, read as UTF-8 chunks that stream
corpus.py    built-in corpora (an offline default, an optional download)
prepare.py   tokenize into ``train.bin``/``val.bin`` (or numbered shards) + ``meta.json`` + ``tokenizer.json``
workers.py   a pool of tokenizer processes whose results come back in input order
shards.py    ``ShardWriter`` (numbered shard files) and ``ShardedTokens`` (shards read as one array)
dataset.py   ``TokenDataset``: a prepared directory read back as memmaps
sampler.py   ``WindowSampler`` (training, exact resume) and ``eval_batches``
chat.py      chat / alpaca records → rows of tokens with a loss mask and example boundaries
"""

from gptlab.data.chat import ChatOptions, prepare_alpaca, prepare_chat
from gptlab.data.dataset import DATASET_FORMAT, EOT, META_FILE, SPLITS, TOKENIZER_FILE, TokenDataset
from gptlab.data.prepare import build_tokenizer, prepare, token_dtype
from gptlab.data.sampler import WindowSampler, eval_batches, n_eval_batches
from gptlab.data.sources import count_documents, describe_sources, find_sources, iter_chunks

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
    "find_sources",
    "iter_chunks",
    "n_eval_batches",
    "prepare",
    "token_dtype",
]
