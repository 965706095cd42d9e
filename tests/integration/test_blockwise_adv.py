"""blockwise_adv and rs_grpo on the tiny model: one real step, full and LoRA, with two reward functions scoring two
tagged blocks of fixed completions (a rollout_func writes them), so the advantages the trainer produces can be
checked token by token against hand-derived numbers."""

import pytest
import torch

import trl_groupx
from tests.conftest import build_trainer, grads_differ, one_step
from trl_groupx.rewards._utils import completion_text, tag_content

TAGS = ["a", "b"]
# Two groups of G=4. Block 0 runs to "</a>" (untagged text before it included), block 1 to "</b>"; text after
# "</b>" is outside; row 3 is truncated inside <b> (its block 1 runs to the end and its r_b is unscored).
TEXTS = [
    "<a>1</a><b>1</b>",
    "<a>1</a><b>0</b>",
    "<a>0</a><b>1</b>zz",
    "<a>0</a><b>0",
    "<a>1</a> <b>1</b>",
    "<a>0</a><b>1</b>",
    "<a>0</a><b>0</b>",
    "hm<a>1</a><b>0</b>",
]
# r_a = [1, 1, 0, 0 | 1, 0, 0, 1], r_b = [1, 0, 1, NaN | 1, 1, 0, 0]. Unscaled (blockwise_adv_scale_rewards=False):
#   block 0: r_a − group mean 0.5 → [.5, .5, −.5, −.5 | .5, −.5, −.5, .5]
#   block 1: stratum of equal r_a; group 0: {0, 1} mean r_b 0.5 → +.5, −.5; {2, 3}: only row 2 scored → 0,
#   row 3 NaN → 0; group 1: {4, 7} mean 0.5 → +.5 (row 4), −.5 (row 7); {5, 6} mean 0.5 → +.5 (row 5),
#   −.5 (row 6)
BLOCK0 = [0.5, 0.5, -0.5, -0.5, 0.5, -0.5, -0.5, 0.5]
BLOCK1 = [0.5, -0.5, 0.0, 0.0, 0.5, 0.5, -0.5, -0.5]


def tagged_rollout(prompts, trainer):
    tok = trainer.processing_class
    out = {"prompt_ids": [], "completion_ids": [], "logprobs": None}
    for i, prompt in enumerate(prompts):
        prompt_ids = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False)
        if isinstance(prompt_ids, dict) or hasattr(prompt_ids, "keys"):
            prompt_ids = prompt_ids["input_ids"]
        out["prompt_ids"].append(list(prompt_ids))
        out["completion_ids"].append(tok.encode(TEXTS[i % len(TEXTS)], add_special_tokens=False))
    return out


def tag_reward(tag):
    def reward(completions, **kwargs):
        values = [tag_content(completion_text(c), tag) for c in completions]
        return [None if v is None else float(v == "1") for v in values]

    reward.__name__ = f"reward_{tag}"
    return reward


def ours(tmp_path, peft=False, **flags):
    return build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, tmp_path, peft=peft,
                         reward_funcs=[tag_reward("a"), tag_reward("b")], rollout_func=tagged_rollout,
                         max_completion_length=24, **flags)


def expected_token_advantages(inputs, tokenizer, block0=BLOCK0, block1=BLOCK1):
    """Per row (rows arrive shuffled: identified by their text), A_a on block-0 tokens, A_b on block-1 tokens."""
    rows = []
    for ids, mask in zip(inputs["completion_ids"], inputs["completion_mask"], strict=True):
        text = tokenizer.decode(ids[mask.bool()].tolist())
        i = TEXTS.index(text)
        end0 = text.index("</a>") + 4
        end1 = text.index("</b>") + 4 if "</b>" in text else len(text)
        row = [block0[i]] * end0 + [block1[i]] * (end1 - end0) + [0.0] * (len(text) - end1)
        rows.append(row + [0.0] * (ids.numel() - len(row)))  # one character per token with the tiny tokenizer
    return torch.tensor(rows), [TEXTS.index(tokenizer.decode(ids[m.bool()].tolist()))
                                for ids, m in zip(inputs["completion_ids"], inputs["completion_mask"], strict=True)]


@pytest.mark.parametrize("peft", [False, True])
def test_blockwise_adv_block_advantages_and_gradient(tmp_path, peft):
    flags = dict(loss_type="dapo", blockwise_adv_block_tags=TAGS)
    trainer = ours(tmp_path / "bw", peft, token_weighting="blockwise_adv", blockwise_adv_scale_rewards=False, **flags)
    _, grads, inputs = one_step(trainer)
    expected, order = expected_token_advantages(inputs, trainer.processing_class)
    torch.testing.assert_close(inputs["advantages"], expected)
    # block 1 of row 3 (truncated, r_b NaN) and the trailing "zz" of row 2 get nothing; row 7's "hm" gets A_a
    assert sorted(order) == list(range(8))
    # block-0 tokens never receive r_b's signal: same advantages when r_b is replaced by another reward
    other = ours(tmp_path / "bw2", peft, token_weighting="blockwise_adv", blockwise_adv_scale_rewards=False, **flags)
    other.reward_funcs[1] = lambda completions, **kw: [float(len(completion_text(c)) % 3) for c in completions]
    _, _, other_inputs = one_step(other)
    assert torch.equal(other_inputs["completion_ids"], inputs["completion_ids"])
    tok = trainer.processing_class
    for row, (ids, mask) in enumerate(zip(inputs["completion_ids"], inputs["completion_mask"], strict=True)):
        end0 = tok.decode(ids[mask.bool()].tolist()).index("</a>") + 4
        torch.testing.assert_close(other_inputs["advantages"][row, :end0], inputs["advantages"][row, :end0])
    assert not torch.equal(other_inputs["advantages"], inputs["advantages"])
    # plain GRPO on the same batch (sum of the two rewards, one advantage per completion) trains differently
    base = ours(tmp_path / "base", peft, loss_type="dapo")
    _, base_grads, base_inputs = one_step(base)
    assert torch.equal(base_inputs["completion_ids"], inputs["completion_ids"])
    assert grads_differ(base_grads, grads)


def test_blockwise_adv_default_scaling_divides_by_group_std(tmp_path):
    trainer = ours(tmp_path, token_weighting="blockwise_adv", blockwise_adv_block_tags=TAGS, loss_type="dapo")
    _, _, inputs = one_step(trainer)
    # Bessel std over each group: r_a = [1,1,0,0] and [1,0,0,1] → sqrt(1/3); r_b group 0 = [1, 0, 1] (NaN left out)
    # → sqrt(1/3); group 1 = [1, 1, 0, 0] → sqrt(1/3); each + 1e-4
    s = (1 / 3) ** 0.5 + 1e-4
    expected, _ = expected_token_advantages(inputs, trainer.processing_class,
                                            [a / s for a in BLOCK0], [b / s for b in BLOCK1])
    torch.testing.assert_close(inputs["advantages"], expected)


@pytest.mark.parametrize("peft", [False, True])
def test_rs_grpo_scoped_advantages_and_gradient(tmp_path, peft):
    trainer = ours(tmp_path / "rs", peft, token_weighting="rs_grpo", rs_grpo_block_tags=TAGS, loss_type="dual_clip",
                   loss_aggregation="global_token_mean")
    _, grads, inputs = one_step(trainer)
    # per-scope z-scores (ε 1e-6): r_a groups → ±0.5/sqrt(1/3); r_b group 0 = [1, 0, 1, NaN] → mean 2/3,
    # std sqrt(((1/3)² + (2/3)² + (1/3)²)/2) = sqrt(1/3) → [1/3, −2/3, 1/3, 0]/s; group 1 → ±0.5/s
    s = (1 / 3) ** 0.5 + 1e-6
    block0 = [a / s for a in BLOCK0]
    block1 = [x / s for x in [1 / 3, -2 / 3, 1 / 3, 0.0, 0.5, 0.5, -0.5, -0.5]]
    mask = inputs["completion_mask"].bool()
    unweighted, _ = expected_token_advantages(inputs, trainer.processing_class, block0, block1)
    # scope weights n_tot / (n_k · 2): count the scopes' tokens from the texts
    tok = trainer.processing_class
    n0 = n1 = 0
    for ids, m in zip(inputs["completion_ids"], mask, strict=True):
        text = tok.decode(ids[m].tolist())
        end0 = text.index("</a>") + 4
        n0 += end0
        n1 += (text.index("</b>") + 4 if "</b>" in text else len(text)) - end0
    n_tot = int(mask.sum())
    w0, w1 = n_tot / (n0 * 2), n_tot / (n1 * 2)
    scale = torch.zeros_like(unweighted)
    for row, (ids, m) in enumerate(zip(inputs["completion_ids"], mask, strict=True)):
        text = tok.decode(ids[m].tolist())
        end0 = text.index("</a>") + 4
        scale[row, :end0] = w0
        scale[row, end0:] = w1
    torch.testing.assert_close(inputs["advantages"], unweighted * scale)
    base = ours(tmp_path / "base", peft, loss_type="dual_clip", loss_aggregation="global_token_mean")
    _, base_grads, _ = one_step(base)
    assert grads_differ(base_grads, grads)


def test_composes_with_the_cispo_objective(tmp_path):
    trainer = ours(tmp_path / "bw", token_weighting="blockwise_adv", blockwise_adv_block_tags=TAGS,
                   blockwise_adv_scale_rewards=False, loss_type="cispo")
    loss, grads, inputs = one_step(trainer)
    assert torch.isfinite(loss)
    expected, _ = expected_token_advantages(inputs, trainer.processing_class)
    torch.testing.assert_close(inputs["advantages"], expected)  # the objective reads the block advantages
    _, base_grads, _ = one_step(ours(tmp_path / "base", loss_type="cispo"))
    assert grads_differ(base_grads, grads)


def test_tags_must_match_the_reward_functions(tmp_path):
    with pytest.raises(ValueError, match=r"blockwise_adv_block_tags=\['a', 'b', 'c'\] names 3 block\(s\) for 2"):
        ours(tmp_path, token_weighting="blockwise_adv", blockwise_adv_block_tags=["a", "b", "c"])
