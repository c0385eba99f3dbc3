"""The config's workload section: what every trial trains (the model, its batch, optimizer and
steps), how (precision, clipping, schedule), DDP's arguments for the model, and compile."""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, Field, field_validator, model_validator

from service.config.compiled import COMPILE_MODES, mode_refusal
from service.config.errors import FieldProblem, exception_text
from service.config.limits import MAX_GLOBAL_BATCH, MAX_GRAD_ACCUMULATION, MAX_LR, MAX_STEPS
from service.config.sections import STRICT
from service.text import short_value


class WorkloadConfig(BaseModel):
    model_config = STRICT

    name: str = Field(min_length=1, description="built-in workload or 'package.module:function'")
    steps: int = Field(ge=1, le=MAX_STEPS, description="optimizer steps per trial")
    global_batch_size: int = Field(ge=1, le=MAX_GLOBAL_BATCH, description="held fixed across world sizes; "
                                   "default: the workload's (service.workloads.training_defaults)")
    grad_accumulation: int = Field(1, ge=1, le=MAX_GRAD_ACCUMULATION, description="micro-batches per step")
    lr: float = Field(gt=0, le=MAX_LR, description="default: the workload's for the optimizer")
    optimizer: Literal["sgd", "adamw"] = "sgd"
    eval_every: int = Field(50, ge=1, le=MAX_STEPS, description="steps between evaluations")
    warmup_steps: int = Field(5, ge=0, le=MAX_STEPS, description="first steps, excluded from throughput")
    # Training realism (service/train/training_options.py says what each does, and where).
    precision: Literal["fp32", "bf16_autocast", "bf16"] = Field(
        "fp32", description="fp32 | bf16_autocast (fp32 weights, bf16 forward) | bf16 (bf16 weights and DDP buckets)")
    grad_clip_norm: float | None = Field(None, gt=0, le=1e6, description="clip the averaged gradient's L2 norm; null = off")
    lr_schedule: Literal["constant", "cosine"] = "constant"
    lr_warmup_steps: int = Field(0, ge=0, le=MAX_STEPS, description="linear LR warm-up steps (not warmup_steps)")
    # DDP's own arguments for the model (the search axes bucket_cap_mb etc. are DDP's too, but
    # compared; these are the model's needs).
    find_unused_parameters: Union[Literal["auto"], bool] = Field(
        "auto", description="auto: on exactly when the start-of-trial probe finds a parameter with no gradient")
    broadcast_buffers: bool = Field(True, description="DDP broadcasts rank 0's buffers (BatchNorm stats) every forward")
    # torch.compile of the module inside DDP, the hook and reducer eager (service/train/compiled.py):
    # how a compiled trial compiles, and, without search.compile, whether every trial does
    compile: Union[bool, Literal[COMPILE_MODES]] = Field(
        False, description="false | true (mode default) | a torch.compile mode: " + ", ".join(COMPILE_MODES))

    # The blocks an fsdp trial shards one by one (module paths or class names); absent: the
    # workload's own (Workload.shard), or every direct child holding parameters
    shard: list[str] | None = Field(None, min_length=1, description="fsdp: the blocks to shard (module paths "
                                    "or class names); default: the workload's, or each direct child with parameters")

    @model_validator(mode="before")
    @classmethod
    def _workload_defaults(cls, raw: Any) -> Any:
        """A config may leave out global_batch_size and lr: the workload's own fill them in."""
        if not isinstance(raw, dict) or ("global_batch_size" in raw and "lr" in raw):
            return raw
        name, optimizer = raw.get("name"), raw.get("optimizer", "sgd")
        if not isinstance(name, str) or not isinstance(optimizer, str):
            return raw  # the field validators name the problem
        from service.workloads import training_defaults  # imported late: it pulls in torch

        return {**training_defaults(name, optimizer), **raw}

    @field_validator("find_unused_parameters", mode="before")
    @classmethod
    def _auto_or_bool(cls, value: Any) -> Any:
        if value != "auto" and not isinstance(value, bool):
            raise ValueError(f"{short_value(value)} is not allowed; allowed: auto, true or false")
        return value

    @field_validator("compile", mode="before")
    @classmethod
    def _bool_or_mode(cls, value: Any) -> Any:
        refusal = mode_refusal(value)
        if refusal is not None:
            raise ValueError(refusal)
        return value

    @property
    def compile_mode(self) -> str:
        """The torch.compile mode a compiled trial uses (``compile: true``: default)."""
        return self.compile if isinstance(self.compile, str) else "default"

    @field_validator("name")
    @classmethod
    def _known_workload(cls, name: str) -> str:
        from service.workloads import check_workload  # imported late: it pulls in torch

        try:
            check_workload(name)
        except Exception as exc:  # a user's module may raise anything while it imports
            raise ValueError(exception_text(exc)) from None
        return name

    @model_validator(mode="after")
    def _some_steps_are_measured(self) -> "WorkloadConfig":
        if self.warmup_steps >= self.steps:
            default = "" if "warmup_steps" in self.model_fields_set else " (the default)"
            raise FieldProblem(
                "warmup_steps",
                f"{self.warmup_steps} warm-up steps{default} leave none of the {self.steps} steps to "
                f"measure throughput on; allowed: 0 to {self.steps - 1}",
            )
        if self.lr_warmup_steps > self.steps:
            raise FieldProblem("lr_warmup_steps", f"{self.lr_warmup_steps} is more than the {self.steps} steps; "
                                                  f"allowed: 0 to {self.steps}")
        return self


