"""A simulated GPU for the tuner benchmark and tests: real Trainers on CPU under a live-byte budget.

:class:`BudgetMode` is a ``TorchDispatchMode`` that counts every live storage (parameters and buffers registered
up front, everything created under it as it is created, freed when Python frees it) and raises
``torch.OutOfMemoryError`` with CUDA's message once the live bytes pass the budget — the way a GPU's caching
allocator fails. :func:`build_trainer` builds the tiny runs of the tuner tests (full fine-tuning, LoRA,
checkpointing, accumulation, TRL's SFTTrainer) from a config, with random weights and random token ids.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

SEQ = 32
VOCAB = 256
WIDTHS: dict[str, Any] = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                              num_key_value_heads=1, vocab_size=VOCAB, max_position_embeddings=128,
                              pad_token_id=0, eos_token_id=1, bos_token_id=1)


class BudgetMode(TorchDispatchMode):  # type: ignore[misc]
    """Live storage bytes under a budget; ``torch.OutOfMemoryError`` past it.

    Args:
        budget: Bytes.
        tensors: Tensors that exist before the mode starts (parameters, buffers), counted from the start.
    """

    def __init__(self, budget: int, tensors: Any = ()) -> None:
        super().__init__()
        self.budget = budget
        self.current = 0
        self.peak = 0
        self.ooms = 0
        self._live: dict[int, int] = {}
        for t in tensors:
            self._add(t, check=False)

    def _add(self, t: Any, check: bool = True) -> None:
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return
        storage = t.untyped_storage()
        key = id(storage)
        if key in self._live:
            return
        n = int(storage.nbytes())
        self._live[key] = n
        self.current += n
        weakref.finalize(storage, self._free, key)
        self.peak = max(self.peak, self.current)
        if check and self.current > self.budget:
            self.ooms += 1
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {n} bytes (simulated budget {self.budget})"
            )

    def _free(self, key: int) -> None:
        self.current -= self._live.pop(key, 0)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            self._add(t)
        return out


def budget_for(model: Any, budget: int) -> BudgetMode:
    """A :class:`BudgetMode` with the model's parameters and buffers already counted."""
    return BudgetMode(budget, [*model.parameters(), *model.buffers()])


class Tokens(torch.utils.data.Dataset):  # type: ignore[misc]
    """Random token ids of length ``SEQ`` (labels = ids)."""

    def __init__(self, n: int = 64) -> None:
        self.data = torch.randint(2, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.data[i], "labels": self.data[i]}


@dataclass(frozen=True)
class Config:
    """One tuner configuration.

    Attributes:
        name: Row name.
        micro: The user's ``per_device_train_batch_size``.
        accum: The user's ``gradient_accumulation_steps``.
        lora: LoRA r 8 on q/v (peft ``get_peft_model``).
        checkpointing: ``gradient_checkpointing=True``.
        sft: TRL ``SFTTrainer`` on tokenized samples of SEQ to 2·SEQ tokens, truncated to ``max_length=SEQ``.
        target: Index (in the divisors of micro × accum) the budget puts the true maximum at.
    """

    name: str
    micro: int
    accum: int
    lora: bool = False
    checkpointing: bool = False
    sft: bool = False
    target: int = 2
    extra: dict[str, Any] = field(default_factory=dict)


CONFIGS = (
    Config("full FT, 16 x 1", 16, 1, target=2),
    Config("full FT, 4 x 4", 4, 4, target=3),
    Config("LoRA r8, 16 x 1", 16, 1, lora=True, target=3),
    Config("checkpointing, 8 x 2", 8, 2, checkpointing=True, target=2),
    Config("TRL SFTTrainer, 16 x 1", 16, 1, sft=True, target=2),
)


def _model(config: Config) -> Any:
    import transformers

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**WIDTHS))
    if config.lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                                 lora_dropout=0.0, task_type="CAUSAL_LM"))
    return model


def _tokenizer() -> Any:
    import transformers
    from tokenizers import Tokenizer, models

    vocab = {f"t{i}": i for i in range(VOCAB)}
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")), pad_token="t0", eos_token="t1"
    )


def build_trainer(config: Config, out_dir: str, *, micro: int | None = None, accum: int | None = None,
                  max_steps: int = 2, callbacks: list[Any] | None = None, **args_extra: Any) -> Any:
    """A fresh Trainer (same seed, same weights) of ``config``, at ``micro`` × ``accum`` when given.

    ``args_extra`` goes to the TrainingArguments (``auto_find_batch_size=True`` ...).
    """
    import transformers

    common: dict[str, Any] = dict(
        output_dir=out_dir, per_device_train_batch_size=micro or config.micro,
        gradient_accumulation_steps=accum or config.accum, max_steps=max_steps, optim="adamw_torch",
        use_cpu=True, report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True,
        gradient_checkpointing=config.checkpointing, seed=0, **config.extra, **args_extra,
    )
    if "deepspeed" in config.extra:
        from gloo_rank import without_deepspeed_shm_comm

        without_deepspeed_shm_comm()
    model = _model(config)
    if config.sft:
        import datasets
        from trl import SFTConfig, SFTTrainer

        g = torch.Generator().manual_seed(0)
        lengths = torch.randint(SEQ, 2 * SEQ, (64,), generator=g).tolist()  # truncated to SEQ: worst case
        data = datasets.Dataset.from_dict(
            {"input_ids": [torch.randint(2, VOCAB, (int(n),), generator=g).tolist() for n in lengths]}
        )
        args = SFTConfig(max_length=SEQ, bf16=False, **common)
        return SFTTrainer(model=model, args=args, train_dataset=data, processing_class=_tokenizer(),
                          callbacks=callbacks)
    return transformers.Trainer(model=model, args=transformers.TrainingArguments(**common),
                                train_dataset=Tokens(), callbacks=callbacks)


MAX_STEPS = 2  # optimizer steps of every real run in the tuner benchmarks and tests
UNBOUNDED = 10**12  # a budget nothing reaches: measures the real peak


def real_peak(config: Config, out: str, micro: int) -> int:
    """Live-byte peak of real training (MAX_STEPS optimizer steps) at ``micro`` × (per-GPU batch / micro)."""
    per_gpu = config.micro * config.accum
    trainer = build_trainer(config, out, micro=micro, accum=per_gpu // micro, max_steps=MAX_STEPS)
    with budget_for(trainer.model, UNBOUNDED) as mode:
        trainer.train()
    return int(mode.peak)
