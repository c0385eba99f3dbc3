"""char_lm: a small causal transformer predicting the next byte of Python's own
standard-library source (the text every rank of a trial shares)."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from service.workloads.contract import Workload, cross_entropy

# A fixed selection of pure-Python stdlib modules present in CPython 3.10-3.13, read in
# this order. The text therefore depends only on the Python version, which every rank of
# a trial shares. Missing files are skipped; too little text is an error.
STDLIB_TEXT_FILES = (
    "argparse.py", "ast.py", "calendar.py", "collections/__init__.py", "configparser.py",
    "contextlib.py", "copy.py", "csv.py", "dataclasses.py", "datetime.py", "difflib.py",
    "dis.py", "doctest.py", "enum.py", "fractions.py", "functools.py", "gettext.py",
    "heapq.py", "inspect.py", "ipaddress.py", "json/decoder.py", "json/encoder.py",
    "logging/__init__.py", "optparse.py", "pickle.py", "pprint.py", "random.py",
    "shutil.py", "statistics.py", "string.py", "subprocess.py", "tarfile.py",
    "textwrap.py", "threading.py", "tokenize.py", "traceback.py", "typing.py",
)
MIN_TEXT_BYTES = 200_000
VOCAB_SIZE = 256  # bytes: no tokenizer, identical on every machine
CONTEXT_LENGTH = 32
EVAL_FRACTION = 0.1  # the last 10% of the text is held out
EVAL_SEQUENCES = 512  # cap: a full pass over the held-out text would cost many steps

# 0.47M parameters (1.9 MB of gradient) in 30 tensors of many shapes (embeddings, attention,
# MLP, LayerNorm, biases): the realistic mix that per-tensor vs per-chunk hooks care about.
LM_EMBED = 128
LM_LAYERS = 2
LM_HEADS = 4


def stdlib_text() -> bytes:
    """The concatenated source of STDLIB_TEXT_FILES, as bytes."""
    root = Path(sysconfig.get_paths()["stdlib"])
    parts = [(root / rel).read_bytes() for rel in STDLIB_TEXT_FILES if (root / rel).is_file()]
    text = b"\n".join(parts)
    if len(text) < MIN_TEXT_BYTES:
        raise RuntimeError(
            f"char_lm: only {len(text)} bytes of standard-library source under {root}; "
            f"need {MIN_TEXT_BYTES}"
        )
    return text


def _windows(tokens: torch.Tensor, context: int) -> TensorDataset:
    """Non-overlapping windows: x = tokens[i*T : i*T+T], y = the same shifted by one."""
    n = (len(tokens) - 1) // context
    x = tokens[: n * context].view(n, context)
    y = tokens[1 : n * context + 1].view(n, context)
    return TensorDataset(x.clone(), y.clone())


class CausalSelfAttention(nn.Module):
    def __init__(self, embed: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(embed, 3 * embed)
        self.proj = nn.Linear(embed, embed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, embed: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(embed)
        self.attn = CausalSelfAttention(embed, heads)
        self.ln2 = nn.LayerNorm(embed)
        self.mlp = nn.Sequential(nn.Linear(embed, 4 * embed), nn.GELU(), nn.Linear(4 * embed, embed))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class CharTransformer(nn.Module):
    """A nanoGPT-shaped decoder: token + position embeddings, pre-LN blocks, linear head."""

    def __init__(
        self,
        vocab: int = VOCAB_SIZE,
        context: int = CONTEXT_LENGTH,
        embed: int = LM_EMBED,
        layers: int = LM_LAYERS,
        heads: int = LM_HEADS,
    ):
        super().__init__()
        self.context = context
        self.tok_emb = nn.Embedding(vocab, embed)
        self.pos_emb = nn.Embedding(context, embed)
        self.blocks = nn.Sequential(*(Block(embed, heads) for _ in range(layers)))
        self.ln_f = nn.LayerNorm(embed)
        self.head = nn.Linear(embed, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # idx (B, T) byte values
        T = idx.shape[1]
        pos = torch.arange(T, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        return self.head(self.ln_f(self.blocks(x)))  # (B, T, vocab)


def build_char_lm(seed: int) -> Workload:
    tokens = torch.frombuffer(bytearray(stdlib_text()), dtype=torch.uint8).long()
    split = int(len(tokens) * (1 - EVAL_FRACTION))
    train_set = _windows(tokens[:split], CONTEXT_LENGTH)
    eval_x, eval_y = _windows(tokens[split:], CONTEXT_LENGTH).tensors
    eval_set = TensorDataset(eval_x[:EVAL_SEQUENCES], eval_y[:EVAL_SEQUENCES])
    return Workload(CharTransformer(), train_set, eval_set, cross_entropy, shard=("blocks",))  # each Block
