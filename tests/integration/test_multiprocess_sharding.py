"""Data parallel is exact: two processes (torchrun, gloo, CPU) with half the global batch each train like one process
with the whole batch, for one variant per stage and every stateful variant; and a checkpoint of a stateful variant
moves between launchers (2 processes → 1 and 1 → 2) with its state.

Generation is replaced by a deterministic function of (global step, global rollout index) (sharding_helpers.py), so
both launchers see the same 12 rollouts per step (3 groups of 4; the middle group split across the two ranks). One
torchrun launch runs every case (imports dominate the cost); the single-process runs happen in this process.

FSDP: accelerate (1.16) enables its FSDP plugin only when the distributed type is a multi-device accelerator type
(MULTI_GPU, MULTI_NPU, MULTI_XPU, ...; `AcceleratorState.__init__`, accelerate/state.py ~l.947-974): on CPU the type
is MULTI_CPU and `ACCELERATE_USE_FSDP` is ignored, so the Trainer cannot train with FSDP on CPU (an "FSDP" CPU launch
is plain DDP). torch's own FSDP2 (`fully_shard`) does run on CPU with gloo, so test_fsdp2_one_step_matches_one_process
shards the model per decoder layer by hand and checks trl_groupx's code on it: the token-weight stage's forward pass
(entropies of the sharded model), the objective's loss and the backward (full gradients), against one process.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from tests.integration.sharding_helpers import CASES, CHECKPOINT_CASE, FSDP2_CASES, fsdp2_one_step, run_job
from tests.integration.torchrun import launch
from trl_groupx.trainer import VARIANT_STATE_NAME

WORKER = Path(__file__).with_name("mp_sharding_worker.py")
ROOT = WORKER.parents[2]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{name: (single-process record, two-process record)}, plus the two cross-launcher resumes."""
    if shutil.which("torchrun") is None:
        pytest.skip("torchrun not on PATH")
    tmp = tmp_path_factory.mktemp("sharding")
    single = {name: run_job(tmp / "single" / name, flags, save=name == CHECKPOINT_CASE) for name, flags in CASES.items()}
    one_proc_checkpoint = tmp / "single" / CHECKPOINT_CASE / "checkpoint-1"
    launch(WORKER, tmp / "multi", one_proc_checkpoint)
    multi = {name: torch.load(tmp / "multi" / f"{name}.pt", weights_only=False) for name in [*CASES, "resumed"]}
    # 2 processes saved checkpoint-1: resume it here, under 1 process
    resumed_single = run_job(tmp / "single" / "resumed", CASES[CHECKPOINT_CASE],
                             resume_from=str(tmp / "multi" / CHECKPOINT_CASE / "checkpoint-1"))
    fsdp2 = {name: (fsdp2_one_step(tmp / "single" / f"fsdp2_{name}", flags),
                    torch.load(tmp / "multi" / f"fsdp2_{name}.pt", weights_only=False))
             for name, flags in FSDP2_CASES.items()}
    return {"cases": {name: (single[name], multi[name]) for name in CASES}, "tmp": tmp, "fsdp2": fsdp2,
            "resumed_from_2_under_1": resumed_single, "resumed_from_1_under_2": multi["resumed"]}


def _assert_same_weights(a: dict, b: dict, *, rtol: float, what: str) -> None:
    """Per tensor: the two runs' weight updates agree to `rtol` of the update's size (1e-7 absolute floor)."""
    for name in a["deltas"]:
        da, db = a["deltas"][name], b["deltas"][name]
        err = (da - db).abs().max().item()
        assert err <= rtol * da.abs().max().item() + 1e-7, f"{what}: {name} differs by {err:.3g}"


@pytest.mark.parametrize("case", list(CASES))
def test_two_processes_train_like_one(runs, case):
    single, multi = runs["cases"][case]
    assert (single["world"], multi["world"]) == (1, 2)
    # every rank holds the same variant state (trivially {} if stateless)
    assert multi["ranks_agree_on_state"], f"{case}: the ranks' variant states differ"
    token_level = single["advantages"][0].dim() == 2
    for step, (a, b) in enumerate(zip(single["advantages"], multi["advantages"], strict=True)):
        # token-level weights depend on entropies from a forward pass whose batch (and padding) differs: float noise,
        # and at step 1 also the float noise of step 0's update
        atol = (1e-4 if step == 0 else 2e-3) if token_level else 1e-6
        torch.testing.assert_close(b, a, atol=atol, rtol=0, msg=f"{case}: advantages differ at step {step}")
    for step, (a, b) in enumerate(zip(single["kept"], multi["kept"], strict=True)):
        assert torch.equal(a, b), f"{case}: kept rollouts differ at step {step}"
    # DDP averages the ranks' gradients, so the mean of the ranks' losses is the single-process loss; with token-level
    # weights, step 1's loss (a token mean of A·ratio) carries the advantages' float noise, bounded as they are
    for step, ([a], b) in enumerate(zip(single["losses"], multi["losses"], strict=True)):
        assert len(b) == 2
        atol = 2e-3 if token_level and step > 0 else 1e-5
        assert abs(sum(b) / 2 - a) <= atol + 1e-4 * abs(a), f"{case}: loss differs at step {step}: {a} vs {b}"
    assert single["state"].keys() == multi["state"].keys()
    state_atol = 1e-5 if token_level else 1e-9  # token-level state (dcpo's mean NLL) carries the forward's float noise
    for vid in single["state"]:
        for key, value in single["state"][vid].items():
            other = multi["state"][vid][key]
            assert torch.allclose(torch.as_tensor(other), torch.as_tensor(value), atol=state_atol), (case, key, value,
                                                                                                     other)
    # SGD: the update is the gradient, equal to float noise (measured: < 1e-3 of the largest update of a tensor; a
    # wrong normalisation or a local statistic is off by O(1)). AdamW's first steps (ebpo) are ≈ lr·sign(g) and
    # amplify the noise of near-zero gradients (measured ~1e-2); token-level weights carry the entropies' noise.
    exact = CASES[case].get("optim") == "sgd" and not token_level
    _assert_same_weights(single, multi, rtol=5e-3 if exact else 5e-2, what=case)


def _assert_resumed_like_uninterrupted(resumed: dict, uninterrupted: dict) -> None:
    assert resumed["global_step"] == uninterrupted["global_step"] == 2
    assert resumed["ranks_agree_on_state"], "the ranks' variant states differ after resuming"
    for vid, state in uninterrupted["state"].items():
        for key, value in state.items():
            assert torch.allclose(torch.as_tensor(resumed["state"][vid][key]), torch.as_tensor(value), atol=1e-9), key
    # the resumed run's second step saw the same advantages and loss as the uninterrupted run's second step
    torch.testing.assert_close(resumed["advantages"][-1], uninterrupted["advantages"][-1], atol=1e-5, rtol=0)
    for name, w in uninterrupted["weights"].items():
        torch.testing.assert_close(resumed["weights"][name], w, atol=2e-5, rtol=0, msg=name)


def test_checkpoint_from_two_processes_resumes_under_one(runs):
    ckpt = runs["tmp"] / "multi" / CHECKPOINT_CASE / "checkpoint-1"
    saved = torch.load(ckpt / VARIANT_STATE_NAME, weights_only=True)
    assert saved[CHECKPOINT_CASE]["reward_count"] == 12  # one step of the global batch, saved once (rank 0)
    saved_single = torch.load(runs["tmp"] / "single" / CHECKPOINT_CASE / "checkpoint-1" / VARIANT_STATE_NAME,
                              weights_only=True)
    for key, value in saved_single[CHECKPOINT_CASE].items():  # the file does not depend on the launcher
        assert torch.allclose(torch.as_tensor(saved[CHECKPOINT_CASE][key]), torch.as_tensor(value), atol=1e-12), key
    single, multi = runs["cases"][CHECKPOINT_CASE]
    _assert_resumed_like_uninterrupted(runs["resumed_from_2_under_1"], single)
    _assert_resumed_like_uninterrupted(runs["resumed_from_2_under_1"], multi)


def test_checkpoint_from_one_process_resumes_under_two(runs):
    single, multi = runs["cases"][CHECKPOINT_CASE]
    _assert_resumed_like_uninterrupted(runs["resumed_from_1_under_2"], multi)
    _assert_resumed_like_uninterrupted(runs["resumed_from_1_under_2"], single)


@pytest.mark.parametrize("case", list(FSDP2_CASES))
def test_fsdp2_one_step_matches_one_process(runs, case):
    single, sharded = runs["fsdp2"][case]
    assert (single["world"], sharded["world"]) == (1, 2)
    token_level = single["advantages"].dim() == 2
    torch.testing.assert_close(sharded["advantages"], single["advantages"], atol=1e-4 if token_level else 1e-6, rtol=0)
    [loss] = single["losses"]
    assert abs(sum(sharded["losses"]) / 2 - loss) <= 1e-5 + 1e-4 * abs(loss), (loss, sharded["losses"])
    assert single["grads"].keys() == sharded["grads"].keys()
    for name, g in single["grads"].items():  # FSDP2 reduce-scatters the mean of the ranks' gradients
        err = (sharded["grads"][name] - g).abs().max().item()
        assert err <= 1e-4 * g.abs().max().item() + 1e-8, f"{case}: gradient of {name} differs by {err:.3g}"
