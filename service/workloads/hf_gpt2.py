"""hf_gpt2: Hugging Face transformers' GPT-2 (random init, nothing downloaded) on char_lm's
text; needs the optional ``.[hf]`` extra (imported only when the workload is built)."""

from __future__ import annotations

from typing import Mapping, Optional

import torch
import torch.nn as nn
from torch.utils.data import Dataset

from service.workloads.batches import DictTensorDataset, collate_batch, to_device
from service.workloads.char_lm import EVAL_FRACTION, EVAL_SEQUENCES, VOCAB_SIZE, stdlib_text
from service.workloads.contract import Workload

# 2.45M parameters in 40 tensors (3 blocks of 12: LayerNorms, fused qkv Conv1D, projections,
# MLP, all with biases; token + position embeddings, tied head): five times char_lm's
# parameters, at about the same step time per sample as char_lm's twice-shorter context
# (docs/workloads.md, "Sizing").
GPT2_CONTEXT = 64
GPT2_EMBED = 256
GPT2_LAYERS = 3
GPT2_HEADS = 4

def hf_causal_lm_loss(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """A Hugging Face causal LM's own loss: ``model(**batch).loss`` (labels shifted inside)."""
    return model(**batch).loss


@torch.no_grad()
def hf_causal_lm_eval(model: nn.Module, eval_set: Dataset, batch_size: int = 256) -> dict[str, float]:
    """eval_loss (the model's own loss, weighted by predicted positions) and eval_accuracy
    (next-byte argmax match rate) of a Hugging Face causal LM whose labels are its inputs."""
    device = next(model.parameters()).device
    total_loss, correct, positions = 0.0, 0, 0
    for start in range(0, len(eval_set), batch_size):
        batch = to_device(collate_batch(eval_set, torch.arange(start, min(start + batch_size, len(eval_set)))),
                          device)
        out = model(**batch)
        predicted = out.logits[:, :-1].argmax(dim=-1)
        targets = batch["labels"][:, 1:]
        n = targets.numel()
        total_loss += float(out.loss) * n
        correct += int((predicted == targets).sum())
        positions += n
    return {"eval_loss": total_loss / positions, "eval_accuracy": correct / positions}


def build_hf_gpt2(seed: int) -> Workload:
    from transformers import GPT2Config, GPT2LMHeadModel  # the optional extra: imported only here

    tokens = torch.frombuffer(bytearray(stdlib_text()), dtype=torch.uint8).long()
    split = int(len(tokens) * (1 - EVAL_FRACTION))

    def windows(part: torch.Tensor, limit: Optional[int] = None) -> DictTensorDataset:
        n = len(part) // GPT2_CONTEXT
        ids = part[: n * GPT2_CONTEXT].view(n, GPT2_CONTEXT)[:limit].clone()
        return DictTensorDataset(input_ids=ids, labels=ids)  # the model shifts labels itself

    config = GPT2Config(
        vocab_size=VOCAB_SIZE, n_positions=GPT2_CONTEXT, n_embd=GPT2_EMBED, n_layer=GPT2_LAYERS,
        n_head=GPT2_HEADS, bos_token_id=0, eos_token_id=0, loss_type="ForCausalLM",
        # no dropout (as nanoGPT's small runs): a step is a function of the weights and the
        # batch, so world sizes and hooks compare on the same trajectory
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="sdpa",
    )
    model = GPT2LMHeadModel(config)  # random init from torch's (seeded) RNG: nothing downloaded
    return Workload(model, windows(tokens[:split]), windows(tokens[split:], EVAL_SEQUENCES),
                    batch_loss=hf_causal_lm_loss, eval_fn=hf_causal_lm_eval,
                    shard=("transformer.h",))  # each GPT2Block
