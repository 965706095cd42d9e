"""VADE: Beta posterior update with two-scale decay, Thompson selection, the rollout-filter update on a batch, the
prompt-selection sampler's layout and slices, config checks."""

from types import SimpleNamespace

import pytest
import torch

import trl_groupx
from trl_groupx.contracts import RolloutBatch
from trl_groupx.sampling.prompt_sampler import PromptSelectionSampler, selection_for
from trl_groupx.sampling.vade import (
    decay_toward_prior,
    select_most_informative,
    thompson_variance_scores,
    vade,
    vade_posterior_update,
    vade_select,
)

NAN = float("nan")


def _config(**kw):
    base = {"output_dir": "/tmp/unused", "use_cpu": True, "bf16": False, "rollout_filter": "vade",
            "num_generations": 4, "per_device_train_batch_size": 8}
    return trl_groupx.GRPOConfig(**{**base, **kw})


def _d(values):
    return torch.tensor(values, dtype=torch.float64)


# ---- posterior update ----------------------------------------------------------------------------------------------


def test_decay_toward_prior_keeps_a_fraction_of_the_evidence():
    # prior 1, counts 5, keep half of the 4 beyond the prior: 1 + 0.5·4 = 3; the prior itself is a fixed point
    assert decay_toward_prior(_d([5.0, 1.0]), 0.5, 1.0).tolist() == [3.0, 1.0]


def test_posterior_update_two_batches_by_hand():
    # three prompts at the prior Beta(1, 1), λ_slow = λ_fast = 0.5
    # batch 1: prompt 2 with 2/2 successes, prompt 0 with 1/2. Decays leave the prior unchanged, then
    #   α = [1+1, 1, 1+2] = [2, 1, 3], β = [1+1, 1, 1+0] = [2, 1, 1]
    alpha, beta = vade_posterior_update(_d([1, 1, 1]), _d([1, 1, 1]), torch.tensor([2, 0]), torch.tensor([2, 1]),
                                        torch.tensor([2, 2]), 0.5, 0.5)
    assert alpha.tolist() == [2.0, 1.0, 3.0] and beta.tolist() == [2.0, 1.0, 1.0]
    # batch 2: prompt 2 with 0/2.
    #   slow, all: α = 1 + 0.5(α − 1) = [1.5, 1, 2], β = [1.5, 1, 1]
    #   fast, prompt 2: α₂ = 1 + 0.5(2 − 1) = 1.5, β₂ = 1; evidence: β₂ += 2 → 3
    alpha, beta = vade_posterior_update(alpha, beta, torch.tensor([2]), torch.tensor([0]), torch.tensor([2]), 0.5, 0.5)
    assert alpha.tolist() == [1.5, 1.0, 1.5] and beta.tolist() == [1.5, 1.0, 3.0]


def test_posterior_update_prompt_in_two_groups_decays_once():
    # Beta(3, 1), λ_slow = 1, λ_fast = 0.5: fast decay once → (1 + 0.5·2, 1) = (2, 1); two groups add
    # successes 1 + 2 and failures 1 + 0 → (5, 2)
    alpha, beta = vade_posterior_update(_d([3]), _d([1]), torch.tensor([0, 0]), torch.tensor([1, 2]),
                                        torch.tensor([2, 2]), 1.0, 0.5)
    assert alpha.tolist() == [5.0] and beta.tolist() == [2.0]


def test_posterior_update_group_without_scored_rollout_is_no_visit():
    alpha, beta = vade_posterior_update(_d([3]), _d([2]), torch.tensor([0]), torch.tensor([0]), torch.tensor([0]),
                                        1.0, 0.5)
    assert alpha.tolist() == [3.0] and beta.tolist() == [2.0]


# ---- Thompson selection --------------------------------------------------------------------------------------------


def test_select_most_informative_ties_go_to_the_lower_index():
    scores = _d([0.1, 0.25, 0.25, 0.2])
    assert select_most_informative(scores, 2) == [1, 2]
    assert select_most_informative(scores, 3) == [1, 2, 3]


def test_concentrated_posteriors_select_by_bernoulli_variance():
    # means 0.5, 0.9, 0.1, 0.6 with 10^6 pseudo-counts: draws ≈ means, p(1-p) = .25, .09, .09, .24 → prompts 0, 3
    means = _d([0.5, 0.9, 0.1, 0.6])
    scores = thompson_variance_scores(1e6 * means, 1e6 * (1 - means), seed=0, draw=0)
    torch.testing.assert_close(scores, means * (1 - means), atol=2e-3, rtol=0)
    assert select_most_informative(scores, 2) == [0, 3]


def test_thompson_draws_are_reproducible_from_seed_and_draw_counter():
    a, b = _d([1, 2, 3]), _d([1, 1, 4])
    assert torch.equal(thompson_variance_scores(a, b, 7, 3), thompson_variance_scores(a, b, 7, 3))
    assert not torch.equal(thompson_variance_scores(a, b, 7, 3), thompson_variance_scores(a, b, 7, 4))
    assert not torch.equal(thompson_variance_scores(a, b, 7, 3), thompson_variance_scores(a, b, 8, 3))


def test_prompt_always_solved_is_sampled_less_than_a_half_solved_one():
    # history 8/8 → Beta(9, 1) (p̃ mostly > 0.7, p̃(1-p̃) < .21); 4/8 → Beta(5, 5) (p̃ near 1/2, ≈ .23-.25).
    # One prompt per batch over 200 seeded draws: the half-solved prompt wins most of them (190 with these seeds).
    alpha, beta = _d([9, 5]), _d([1, 5])
    picks = [select_most_informative(thompson_variance_scores(alpha, beta, 0, d), 1)[0] for d in range(200)]
    assert sum(picks) > 170


def test_vade_select_initialises_the_prior_and_counts_draws():
    state = {}
    first = vade_select(state, 2, 5, seed=0)
    assert state["alpha"].tolist() == [1.0] * 5 and state["beta"].tolist() == [1.0] * 5 and state["draws"] == 1
    expected = select_most_informative(thompson_variance_scores(_d([1] * 5), _d([1] * 5), 0, 0), 2)
    assert first == expected and len(set(first)) == 2
    vade_select(state, 2, 5, seed=0)
    assert state["draws"] == 2
    with pytest.raises(ValueError, match="holds posteriors for 5 prompts"):
        vade_select(state, 2, 6, seed=0)


# ---- the rollout-filter call: keep everything, update from the pending prompts ------------------------------------


def test_vade_filter_updates_the_pending_prompts_and_keeps_every_rollout():
    # G = 2; group 0 is prompt 1 with rewards [1, 0] → 1/2; group 1 is prompt 0 with [NaN, 1] → 1/1 (NaN: no trial).
    # λ = 1 (no decay): α = [1+1, 1+1] = [2, 2], β = [1+0, 1+1] = [1, 2]
    state = {"alpha": _d([1, 1]), "beta": _d([1, 1]), "draws": 1, "pending": torch.tensor([1, 0])}
    batch = RolloutBatch(torch.tensor([1.0, 0.0, NAN, 1.0]), torch.ones(4), 2)
    keep = vade(batch, vade_decay_slow=1.0, vade_decay_fast=1.0, state=state)
    assert keep.dtype == torch.bool and keep.all()
    assert state["alpha"].tolist() == [2.0, 2.0] and state["beta"].tolist() == [1.0, 2.0]
    assert state["pending"].numel() == 0


def test_vade_filter_threshold_and_group_sizes():
    # threshold 0.5: 0.5 is a success (>=), 0.49 is not; G = 1 (one rollout per group) and G = 2
    state = {"alpha": _d([1, 1]), "beta": _d([1, 1]), "pending": torch.tensor([0, 1])}
    vade(RolloutBatch(torch.tensor([0.5, 0.49]), torch.ones(2), 1), vade_success_threshold=0.5,
         vade_decay_slow=1.0, vade_decay_fast=1.0, state=state)
    assert state["alpha"].tolist() == [2.0, 1.0] and state["beta"].tolist() == [1.0, 2.0]
    state["pending"] = torch.tensor([1])
    vade(RolloutBatch(torch.tensor([1.0, 1.0]), torch.ones(2), 2), vade_decay_slow=1.0, vade_decay_fast=1.0,
         state=state)  # an all-equal group still counts: 2 successes
    assert state["alpha"].tolist() == [2.0, 3.0] and state["beta"].tolist() == [1.0, 2.0]


def test_vade_filter_without_pending_prompts_changes_nothing():
    state = {}
    assert vade(RolloutBatch(torch.tensor([1.0, 0.0]), torch.ones(2), 2), state=state).all() and state == {}


def test_vade_filter_rejects_infinite_rewards_and_wrong_sizes():
    state = {"alpha": _d([1]), "beta": _d([1]), "pending": torch.tensor([0])}
    with pytest.raises(ValueError, match="infinite reward"):
        vade(RolloutBatch(torch.tensor([1.0, float("inf")]), torch.ones(2), 2), state=state)
    with pytest.raises(ValueError, match="4 rollouts for 1 selected prompts"):
        vade(RolloutBatch(torch.zeros(4), torch.ones(4), 2), state=state)


# ---- the sampler: placeholder layout, one slice per process -------------------------------------------------------


def _trainer(process_index=0, num_processes=1, steps_per_generation=1, num_iterations=1):
    args = SimpleNamespace(generation_batch_size=4, steps_per_generation=steps_per_generation, seed=0)
    return SimpleNamespace(args=args, num_generations=2, num_iterations=num_iterations, variant_state={"vade": {}},
                           accelerator=SimpleNamespace(process_index=process_index, num_processes=num_processes))


def test_sampler_placeholders_have_trls_layout_and_length():
    # 5 prompts, 2 per generation batch (4 rollouts / G = 2): 2 full batches, each prompt twice, each batch R times
    sampler = PromptSelectionSampler(_trainer(), list(range(5)), vade_select, "vade")
    assert list(sampler) == [0, 0, 1, 1, 2, 2, 3, 3] and len(sampler) == 8
    repeated = PromptSelectionSampler(_trainer(steps_per_generation=2), list(range(5)), vade_select, "vade")
    assert list(repeated)[:8] == [0, 0, 1, 1, 0, 0, 1, 1] and len(repeated) == 16


def test_sampler_rows_are_each_process_slice_of_one_global_selection():
    dataset = [{"prompt": f"p{i}"} for i in range(5)]
    rows = []
    for rank in (0, 1):  # each process: 2 local rows of a global batch of 4 = 2 prompts × G = 2
        trainer = _trainer(rank, 2)
        sampler = PromptSelectionSampler(trainer, dataset, vade_select, "vade")
        rows.append(sampler.generation_rows([{}, {}]))
        pending = trainer.variant_state["vade"]["pending"].tolist()
    expected = vade_select({}, 2, 5, seed=0)
    assert pending == expected
    assert rows == [[dataset[expected[0]]] * 2, [dataset[expected[1]]] * 2]


def test_sampler_refuses_more_prompts_per_batch_than_the_dataset_has():
    with pytest.raises(ValueError, match="selects 2 distinct prompts per generation batch"):
        PromptSelectionSampler(_trainer(), [0], vade_select, "vade")


def test_only_prompt_selecting_variants_get_the_sampler():
    assert selection_for("vade") is vade_select
    assert selection_for("zero_variance_filter") is None and selection_for(None) is None


# ---- config ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("flag, value", [("vade_decay_slow", 0.0), ("vade_decay_fast", 1.5),
                                         ("vade_success_threshold", NAN)])
def test_bad_values_fail_at_config_construction(flag, value):
    with pytest.raises(ValueError, match=flag):
        _config(**{flag: value})


def test_vade_fields_need_the_variant():
    with pytest.raises(ValueError, match="set rollout_filter='vade'"):
        trl_groupx.GRPOConfig(output_dir="/tmp/unused", use_cpu=True, bf16=False, vade_decay_fast=0.5)
    assert _config(vade_decay_slow=1.0, vade_decay_fast=1.0).vade_decay_slow == 1.0
