"""DaGRPO on the tiny model: a scorer declares the first two completions of every group near-identical while the
verifier gives them opposite rewards; both rows leave the update (advantage 0, no loss tokens) and the gradient
differs from plain GRPO's, full and LoRA. Composition with GCPO's reference injection (DaGRPO's anchors), the
built-in toy scorer, and a scorer that finds nothing indistinct (GRPO's gradient exactly)."""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, generate_first_batch, grads_differ, one_step
from tests.integration.test_gcpo_ref import DATASET, _reward
from trl_groupx.advantages.dagrpo import dagrpo_advantages, register_dagrpo_scorer

G = 4  # conftest: num_generations 4, per_device_train_batch_size 8 -> 2 groups


def row_parity_verifier(completions, **kwargs) -> list[float]:
    """1 on odd rows: every group is [0, 1, 0, 1], so rows 0 and 1 of a group have opposite advantages."""
    return [float(i % 2) for i in range(len(completions))]


class FirstPairScorer:
    """Similarity 1 between a group's first two completions (and on the diagonal), 0 elsewhere; records calls."""

    def __init__(self, pair=True):
        self.calls, self.pair = [], pair

    def __call__(self, completions, completion_ids, **kwargs):
        self.calls.append((list(completions), [list(c) for c in completion_ids]))
        g = len(completions)
        sim = [[float(i == j) for j in range(g)] for i in range(g)]
        if self.pair:
            sim[0][1] = sim[1][0] = 1.0
        return sim


@pytest.fixture
def scorer():
    scorer = FirstPairScorer()
    register_dagrpo_scorer("first_pair_test_scorer", scorer)
    return scorer


ON = {"advantage_estimator": "dagrpo", "dagrpo_scorer": "first_pair_test_scorer"}


def _trainer(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft,
                         reward_funcs=[row_parity_verifier], **flags)


@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
def test_indistinct_pair_is_masked_and_gradient_differs(tmp_path, peft, scorer):
    _, base_grads, base_inputs = one_step(_trainer(tmp_path / "base", peft))
    _, grads, inputs = one_step(_trainer(tmp_path / "dagrpo", peft, **ON))
    assert torch.equal(inputs["completion_ids"], base_inputs["completion_ids"])  # same batch
    # one call per group, each with that group's completions without padding
    assert len(scorer.calls) == 2 and all(len(texts) == G for texts, _ in scorer.calls)
    # rewards [0, 1, 0, 1] per group: A = ±0.5/(sqrt(1/3)+1e-4) = ±0.86588; rows 0, 1 masked -> [0, 0, -a, a]
    a = 0.5 / (3 ** -0.5 + 1e-4)
    expected = torch.tensor([0.0, 0.0, -a, a] * 2)
    torch.testing.assert_close(inputs["advantages"].sort().values, expected.sort().values)  # TRL shuffles rows
    assert (inputs["completion_mask"].sum(-1) == 0).sum() == 4  # the masked rows have no loss tokens
    assert (base_inputs["completion_mask"].sum(-1) == 0).sum() == 0
    assert grads_differ(base_grads, grads)


def test_scorer_sees_the_decoded_unpadded_completions(tmp_path, scorer):
    trainer = _trainer(tmp_path, **ON, shuffle_dataset=False)
    _, output = generate_first_batch(trainer)
    mask = output["completion_mask"]  # masked rows 0, 1 of each group have mask 0 now; compare the token ids
    ids = [ids for _, group in scorer.calls for ids in group]
    for i, row in enumerate(ids):
        assert output["completion_ids"][i, : len(row)].tolist() == row
    texts = [t for group, _ in scorer.calls for t in group]
    assert texts == trainer.processing_class.batch_decode(ids, skip_special_tokens=True)
    assert mask[[0, 1, 4, 5]].sum() == 0 and (mask[[2, 3, 6, 7]].sum(-1) > 0).all()


def test_no_indistinct_pair_gives_grpo_gradient(tmp_path):
    register_dagrpo_scorer("no_pair_test_scorer", FirstPairScorer(pair=False))
    _, base_grads, base_inputs = one_step(_trainer(tmp_path / "base"))
    _, grads, inputs = one_step(_trainer(tmp_path / "dagrpo", advantage_estimator="dagrpo",
                                         dagrpo_scorer="no_pair_test_scorer"))
    torch.testing.assert_close(inputs["advantages"], base_inputs["advantages"])
    assert not grads_differ(base_grads, grads, atol=1e-6)


def test_built_in_toy_scorer_runs(tmp_path):
    _, grads, inputs = one_step(_trainer(tmp_path, advantage_estimator="dagrpo", dagrpo_scorer="token_jaccard"))
    assert torch.isfinite(inputs["advantages"]).all() and all(torch.isfinite(g).all() for g in grads.values())


def test_anchors_compose_with_gcpo_reference_injection(tmp_path, scorer):
    """The scripted first-call reward: group 0 = [1, 0, 0, 0] (mixed), group 1 all fail -> its last row becomes the reference
    (reward 1). Advantages: group 0 A = [1.4997, -0.4999 x3] (mean .25, std .5), rows 0, 1 opposite and
    indistinct -> masked; group 1 = [0, 0, 0, 1] -> [-0.4999 x3, 1.4997], rows 0, 1 both negative -> kept, and the
    anchor keeps its positive advantage."""
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, dataset=DATASET,
                            reward_funcs=_reward(), rollout_filter="gcpo_ref", shuffle_dataset=False,
                            max_completion_length=8, **ON)
    batch, output = generate_first_batch(trainer)
    tok = trainer.processing_class
    reference = tok(batch[7]["solution"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert scorer.calls[1][1][3] == reference  # the scorer saw the injected anchor in its group
    r = trainer._rewards_per_func[:, 0]
    assert r.tolist() == [1.0, 0, 0, 0, 0, 0, 0, 1.0]
    hi, lo = 0.75 / (0.5 + 1e-4), -0.25 / (0.5 + 1e-4)
    torch.testing.assert_close(output["advantages"], torch.tensor([0.0, 0.0, lo, lo, lo, lo, lo, hi]))
    assert output["completion_mask"][:2].sum() == 0 and (output["completion_mask"][2:].sum(-1) > 0).all()
    sim = torch.stack([torch.tensor(scorer.__call__(*c)) for c in scorer.calls[:2]])
    adv, _ = dagrpo_advantages(r, G, pair_similarity=sim)
    torch.testing.assert_close(output["advantages"], adv.float())
    _, grads, _ = one_step(build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path / "step",
                                         dataset=DATASET, reward_funcs=_reward(), rollout_filter="gcpo_ref",
                                         max_completion_length=8, **ON))
    assert all(torch.isfinite(g).all() for g in grads.values())
