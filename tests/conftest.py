"""Shared fixtures: offline environment, the shipped tiny model, and a one-step gradient harness."""

from __future__ import annotations

import os

# Tests never touch the network: set before transformers/TRL are imported anywhere.
for _key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "TRL_EXPERIMENTAL_SILENCE"):
    os.environ[_key] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The tiny model's matrices are far too small for intra-op threads: two OpenMP threads on two cores spend ~100x
# longer synchronising than computing.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from trl_groupx.toy import arithmetic_dataset, load_tiny_tokenizer, tiny_model_path  # noqa: E402


def parity_reward(completions, **kwargs) -> list[float]:
    """Deterministic 0/1 reward (last character has an odd code point → 1) that mixes within groups, so every
    loss type has a non-zero gradient to compare."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [float(ord(t[-1]) % 2) if t else 0.0 for t in texts]


def base_config_kwargs(tmp_path, **overrides) -> dict:
    kwargs = dict(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=6,
        max_steps=1,
        learning_rate=1e-3,
        report_to="none",
        logging_steps=1,
        gradient_checkpointing=False,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    kwargs.update(overrides)
    return kwargs


def build_trainer(trainer_cls, config_cls, tmp_path, *, peft=False, reward_funcs=None, dataset=None, rollout_func=None,
                  model=None, processing_class=None, **overrides):
    from peft import LoraConfig

    args = config_cls(**base_config_kwargs(tmp_path, **overrides))
    return trainer_cls(
        model=model if model is not None else tiny_model_path(),  # another model: e.g. the tiny one with added tokens
        reward_funcs=reward_funcs if reward_funcs is not None else parity_reward,
        train_dataset=dataset if dataset is not None else arithmetic_dataset(64, seed=0),
        processing_class=processing_class if processing_class is not None else load_tiny_tokenizer(),
        args=args,
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear") if peft else None,
        **({"rollout_func": rollout_func} if rollout_func is not None else {}),
    )


def one_step(trainer, seed: int = 0):
    """Generate one batch, compute the loss and backprop once: returns (loss, {param name: grad}, inputs)."""
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps  # set by Trainer.train
    torch.manual_seed(seed)
    batch = next(iter(trainer.get_train_dataloader()))
    torch.manual_seed(seed)
    inputs = trainer._prepare_inputs(batch)
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    grads = {
        n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad and p.grad is not None
    }
    return loss.detach(), grads, inputs


def generate_first_batch(trainer):
    """TRL's generation and scoring (with the run's stages) of the train dataloader's first batch, seeded, before
    TRL shuffles and splits it: returns `(rows, output)`."""
    trainer.model.train()
    torch.manual_seed(0)
    batch = next(iter(trainer.get_train_dataloader()))
    torch.manual_seed(0)
    return batch, trainer._generate_and_score_completions(batch)


def assert_same_state(a, b, where: str = "state") -> None:
    """Nested dicts, lists, tuples and tensors equal, bit for bit (a variant's state after a resume, or on two
    processes)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            assert_same_state(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_state(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    else:
        assert a == b, where


def assert_same_weights(a, b) -> None:
    """Every parameter of trainer `a`'s model equals trainer `b`'s, bit for bit (a resumed run against the
    uninterrupted one, a no-op flag against plain TRL)."""
    for (name, p), (_, q) in zip(a.model.named_parameters(), b.model.named_parameters(), strict=True):
        assert torch.equal(p, q), f"{name} differs"


def grads_differ(a: dict, b: dict, atol: float = 1e-7) -> bool:
    assert a.keys() == b.keys()
    return any(not torch.allclose(a[k], b[k], atol=atol, rtol=0) for k in a)


@pytest.fixture
def tokenizer():
    return load_tiny_tokenizer()
