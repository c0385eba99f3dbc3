"""Workload registry: the model, data and loss a sweep trial trains.

A workload is everything a worker needs besides the hook:

    wl = build_workload("char_lm", seed=0)
    logits = wl.model(x)              # (..., C) logits
    loss = wl.loss_fn(logits, y)      # y (...) holds class indices
    eval_loss, eval_accuracy = evaluate(wl.model, wl.eval_set, wl.loss_fn)

Built-ins (real data that ships with the installed packages; nothing is downloaded):

    mlp_digits   MLP on scikit-learn's handwritten digits (64 pixels -> 10 classes)
    cnn_digits   small CNN on the same digits as 1x8x8 images
    char_lm      small causal transformer predicting the next byte of Python's own
                 standard-library source

    hf_gpt2      Hugging Face transformers' GPT-2 (built from a config: random init, no
                 download) on the same text, model(**batch).loss; needs the `.[hf]` extra

A user's own workload is named "package.module:function": the module is imported and
function(seed) must return a Workload, a plain dict with the same keys, or a
(model, train_set, eval_set, loss_fn) tuple. The loss is either loss_fn(logits, targets)
(model(x) gives logits, datasets yield (x, y)) or batch_loss(model, batch) -> scalar, which
gets the whole batch as torch's default collate builds it (a tuple or a dict of tensors);
eval_fn(model, eval_set) -> {metric: float} is optional. See docs/workloads.md and examples/.

Determinism: build_workload(name, seed) seeds torch's RNG with `seed` (inside a forked
RNG, so the caller's RNG state is untouched), so every rank of a trial builds identical
weights and the same train/eval split, as DDP requires.

The modules, by what they hold:

    contract.py    Workload (the two loss forms), WorkloadInfo, the defaults a config may leave out
    digits.py      mlp_digits, cnn_digits
    char_lm.py     char_lm (and the stdlib text hf_gpt2 shares)
    hf_gpt2.py     hf_gpt2 (the .[hf] extra)
    registry.py    names, check_workload (before Ray), build_workload (seeded, checked)
    batches.py     gathering a batch by index, DictTensorDataset, to_device
    evaluation.py  evaluate_workload and the default evals
"""

from service.workloads.batches import (DictTensorDataset, batch_size_of, collate_batch, fetch_batch,
                                       to_device)
from service.workloads.contract import (DEFAULT_GLOBAL_BATCH, DEFAULT_LR, BatchLoss, EvalFn, LossFn, Workload,
                                        WorkloadInfo, cross_entropy)
from service.workloads.evaluation import eval_share, evaluate, evaluate_batch_loss, evaluate_workload, metrics_from_sums
from service.workloads.registry import (BUILTIN_WORKLOADS, OPTIONAL_WORKLOADS, WORKLOAD_KEYS, build_workload,
                                        check_workload, training_defaults, workload_names)

__all__ = ["BUILTIN_WORKLOADS", "DEFAULT_GLOBAL_BATCH", "DEFAULT_LR", "OPTIONAL_WORKLOADS", "WORKLOAD_KEYS",
           "BatchLoss", "DictTensorDataset", "EvalFn", "LossFn", "Workload", "WorkloadInfo", "batch_size_of",
           "build_workload", "check_workload", "collate_batch", "cross_entropy", "evaluate",
           "eval_share", "evaluate_batch_loss", "evaluate_workload", "metrics_from_sums", "fetch_batch", "to_device", "training_defaults",
           "workload_names"]
