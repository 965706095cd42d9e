"""Advantage-stage throughput: every registered advantage function on a large batch of rollouts, against a
straightforward per-group Python loop computing GRPO's advantage (the way several peer frameworks do it).

    python benchmarks/advantage_throughput.py --rollouts 65536 --group-sizes 8 16

Prints rollouts per second for each estimator and the loop; CPU, no model involved. The multi-turn step-credit
estimators get a synthetic 3-turn step record per rollout (their rate counts rollouts, not steps).
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import time

import torch

import trl_groupx
from trl_groupx.config import GRPOConfig


def grpo_per_group_loop(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Reference: GRPO's advantage one group at a time."""
    out = torch.empty_like(rewards)
    for start in range(0, rewards.numel(), group_size):
        group = rewards[start : start + group_size]
        out[start : start + group_size] = (group - group.mean()) / (group.std() + 1e-4)
    return out


STEPS_PER_EPISODE = 3


def synthetic_steps(n: int, group_size: int):
    """Multi-turn view for the step-credit estimators: 3 turns per episode, the first turn of a group at one shared
    anchor state, later states drawn from 4 per group, step rewards 0 (the outcome is the episode reward)."""
    from trl_groupx.advantages.step_credit import StepBatch, state_key

    episode = torch.arange(n).repeat_interleave(STEPS_PER_EPISODE)
    index = torch.arange(STEPS_PER_EPISODE).repeat(n)
    group = episode // group_size
    state = torch.where(index == 0, group * 8, group * 8 + 1 + torch.randint(0, 4, (n * STEPS_PER_EPISODE,)))
    # module labels for the estimators that group by module or agent (mmgrpo, ccpo): a Thinker turn, then Solver turns
    thinker, solver = state_key("thinker"), state_key("solver")
    module = torch.where(index == 0, torch.tensor(thinker), torch.tensor(solver))
    return StepBatch(episode, index, state, torch.zeros(n * STEPS_PER_EPISODE), module=module)


def estimator_calls(num_rewards: int = 2):
    """(name, callable(rewards (N,), rewards_per_func (N, K), lengths (N,), G)) for every advantage variant."""
    config = GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False)
    for variant in trl_groupx.list_variants("advantages"):
        flags = GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, **variant.flags)
        params = inspect.signature(variant.fn).parameters
        kwargs = {n: getattr(flags, n) for n, p in params.items() if p.kind is p.KEYWORD_ONLY and hasattr(flags, n)}
        kwargs.pop("reward_weights", None)
        per_func = "rewards_per_func" in variant.requires or variant.id == "gdpo_multireward"

        def call(r, rk, lengths, g, fn=variant.fn, kwargs=kwargs, per_func=per_func, variant=variant):
            extra = {}
            if variant.stateful:
                extra["state"] = {}
            if "completion_lengths" in variant.requires:
                extra["completion_lengths"] = lengths
            if "prompt_keys" in variant.requires:  # one key per group, as the trainer's prompt hashes give
                extra["prompt_keys"] = torch.arange(r.numel()) // g
            if "global_step" in variant.requires:
                extra.update(global_step=0, total_steps=1)
            if "prompt_kl" in variant.requires:  # SPO's per-prompt drift: every prompt seen before
                extra["prompt_kl"] = torch.full((r.numel(),), 0.03, dtype=torch.float64)
            if "prompt_value_logits" in variant.requires:  # SPPO: the value model's logits (its forward not timed)
                extra["prompt_value_logits"] = torch.zeros_like(r)
            if "counterfactual_rewards" in variant.requires:  # each episode's run without the credited agent
                extra["counterfactual_rewards"] = r.flip(0)
            for name in ("greedy_baseline_rewards", "reference_sample_rewards"):  # the extra completion's reward
                if name in variant.requires:
                    extra[name] = r.flip(0)
            if "step_structure" in variant.requires:
                extra["steps"] = _STEPS[(r.numel(), g)]
            return fn(rk if per_func else r, g, **kwargs, **extra)

        yield variant.id, call
    del config


_STEPS: dict = {}  # (N, G) -> synthetic StepBatch, built once outside the timed calls


def rollouts_per_second(fn, *args, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return args[0].numel() / statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rollouts", type=int, default=65536)
    parser.add_argument("--group-sizes", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--repeats", type=int, default=5)
    ns = parser.parse_args(argv)
    torch.manual_seed(0)
    for g in ns.group_sizes:
        n = ns.rollouts - ns.rollouts % g
        rewards = torch.randint(0, 2, (n,)).float()
        per_func = torch.rand(n, 2)
        lengths = torch.randint(1, 512, (n,)).float()
        _STEPS[(n, g)] = synthetic_steps(n, g)
        loop = rollouts_per_second(grpo_per_group_loop, rewards, g, repeats=max(1, ns.repeats // 2))
        print(f"\nG={g}, N={n}: per-group Python loop (GRPO) {loop:,.0f} rollouts/s")
        print(f"{'estimator':<24} {'rollouts/s':>14} {'× loop':>8}")
        for name, call in estimator_calls():
            rate = rollouts_per_second(call, rewards, per_func, lengths, g, repeats=ns.repeats)
            print(f"{name:<24} {rate:>14,.0f} {rate / loop:>8.1f}")


if __name__ == "__main__":
    main()
