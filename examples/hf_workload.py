"""Your own Hugging Face model as a sweep workload: the model's own loss, dict batches.

    workload:
      name: examples.hf_workload:build

Needs transformers (pip install -e '.[hf]'). Any ``transformers`` model whose forward takes
the batch's keys and returns ``.loss`` works the same way: ``batch_loss`` is
``model(**batch).loss``. This one is a small Llama (2 layers, hidden 128, rotary positions,
RMSNorm, SwiGLU MLP, untied head: 0.46 M parameters in 21 tensors) built from a config with random weights -
``from_config`` downloads nothing, so it works with HF_HUB_OFFLINE=1 and no network. To
sweep a pretrained checkpoint instead, load it with ``from_pretrained`` from a local
directory that every worker can read (workers may have no network).

The data: byte-level next-token prediction on a few of Python's standard-library modules
(no tokenizer to download); items are dicts {"input_ids", "attention_mask", "labels"} as a
tokenizer's output would be, and labels are the inputs (the model shifts them itself).
"""

import sysconfig
from pathlib import Path

import torch
from torch.utils.data import Dataset

CONTEXT = 64
FILES = ("argparse.py", "ast.py", "inspect.py", "typing.py", "tarfile.py")


class Windows(Dataset):
    def __init__(self, ids: torch.Tensor):
        self.ids = ids

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": self.ids[i]}


def batch_loss(model, batch):
    return model(**batch).loss


def build(seed: int):
    from transformers import AutoModelForCausalLM, LlamaConfig

    root = Path(sysconfig.get_paths()["stdlib"])
    text = b"\n".join((root / f).read_bytes() for f in FILES if (root / f).is_file())
    tokens = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
    n = len(tokens) // CONTEXT
    ids = tokens[: n * CONTEXT].view(n, CONTEXT)
    split = int(n * 0.9)
    config = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=CONTEXT,
                         bos_token_id=0, eos_token_id=0, pad_token_id=0, tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(config)  # torch's RNG is seeded for you: same on every rank
    return {"model": model, "train_set": Windows(ids[:split]), "eval_set": Windows(ids[split:][:256]),
            "batch_loss": batch_loss}
