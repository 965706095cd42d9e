"""N-GRPO's Semantic Neighbor Mixing: hand-built neighbour tables, weights and mixed embeddings, the generation hook
(mixing draw, `</think>` cut-off, mix_rate 0 = identity), replay = what the rollout saw, and config refusals."""

import math

import pytest
import torch

import trl_groupx
from trl_groupx.contracts import RolloutBatch
from trl_groupx.sampling.n_grpo import (
    candidate_weights,
    mixed_embeddings,
    n_grpo,
    sampling_probs,
    semantic_neighbours,
)
from trl_groupx.sampling.neighbor_mixing import NeighborMixer, replaying
from trl_groupx.toy import load_tiny_tokenizer, tiny_model_path

# Rows of a toy embedding table and their cosine to row 0 = (1, 0):
#   0 (1, 0) self | 1 (2, .2) cos = 2/sqrt(4.04) = .995 | 2 (0, 1) cos 0 | 3 (1, 1) cos .707 | 4 (-1, 0) cos -1
#   5 (3, 0) cos 1 (same direction as the anchor, another token)
TABLE = torch.tensor([[1.0, 0.0], [2.0, 0.2], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.0], [3.0, 0.0]])
UNIT = torch.nn.functional.normalize(TABLE, dim=-1)


def test_neighbours_are_the_top_cosine_rows_without_the_anchor():
    # anchor 0: cos 1 (row 5) > .995 (row 1) > .707 (row 3); the anchor's own cos 1 is excluded
    assert semantic_neighbours(UNIT, torch.tensor([0]), 4).tolist() == [[0, 5, 1, 3]]
    # anchor 2 = (0, 1): cos .707 (row 3) > .0995 (row 1, .2/2.01) > 0 (rows 0, 4, 5)
    assert semantic_neighbours(UNIT, torch.tensor([2]), 3).tolist() == [[2, 3, 1]]
    # anchor 4 = (-1, 0): cos with (0, 1) is 0, with (1, 1) -.707, so (0, 1) is its nearest
    assert semantic_neighbours(UNIT, torch.tensor([4, 0]), 2).tolist() == [[4, 2], [0, 5]]
    assert semantic_neighbours(UNIT, torch.tensor([3, 1]), 1).tolist() == [[3], [1]]  # K = 1: the anchor alone


def test_weights_are_the_candidates_probabilities_renormalised():
    probs = torch.tensor([[0.5, 0.2, 0.1, 0.1, 0.1, 0.0]])
    # candidates (0, 1, 3): (.5, .2, .1) / .8
    assert candidate_weights(probs, torch.tensor([[0, 1, 3]]))[0].tolist() == pytest.approx([0.625, 0.25, 0.125])
    # a neighbour the policy gives no mass weighs 0 (the official "neighbour 1-7 % or 0")
    assert candidate_weights(probs, torch.tensor([[0, 5]])).tolist() == [[1.0, 0.0]]


def test_mixed_embedding_is_the_weighted_sum():
    # .625 (1, 0) + .25 (2, .2) + .125 (1, 1) = (.625 + .5 + .125, .05 + .125) = (1.25, .175)
    mixed = mixed_embeddings(TABLE[[0, 1, 3]], torch.tensor([0.625, 0.25, 0.125]))
    assert mixed.tolist() == pytest.approx([1.25, 0.175])
    assert mixed_embeddings(TABLE[[2, 3]], torch.tensor([1.0, 0.0])).tolist() == [0.0, 1.0]  # weight 1: the anchor


def test_sampling_probs_temperature_top_k_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    assert sampling_probs(logits, 1.0, None, 1.0)[0].tolist() == pytest.approx([0.5, 0.3, 0.2])
    # T = 2: p ∝ sqrt(p) = (.7071, .5477, .4472) / 1.7020
    assert sampling_probs(logits, 2.0, None, None)[0].tolist() == pytest.approx([0.4155, 0.3218, 0.2628], abs=1e-4)
    assert sampling_probs(logits, 1.0, 2, None)[0].tolist() == pytest.approx([0.625, 0.375, 0.0])
    # top-p .6: mass before the tokens 0, .5, .8 -> the third is dropped; (.5, .3) / .8
    assert sampling_probs(logits, 1.0, 0, 0.6)[0].tolist() == pytest.approx([0.625, 0.375, 0.0])
    # top-p .4: the first token alone (it keeps its mass whatever top_p)
    assert sampling_probs(logits, 1.0, None, 0.4)[0].tolist() == pytest.approx([1.0, 0.0, 0.0])


def _mixer(embedding, rate=1.0, top_k=3, think_end=(), seed=0):
    return NeighborMixer(embedding, mix_rate=rate, top_k=top_k, think_end_ids=list(think_end), temperature=1.0,
                         sampling_top_k=None, sampling_top_p=None, seed=seed)


def test_hook_feeds_the_mix_of_the_argmax_and_stops_after_think_end():
    embedding = torch.nn.Embedding.from_pretrained(TABLE.clone())
    mixer = _mixer(embedding, think_end=(4, 3))
    handle = embedding.register_forward_hook(mixer.hook)
    scores = torch.log(torch.tensor([[0.5, 0.2, 0.1, 0.1, 0.1, 1e-12]]))  # anchor 0 whatever token is sampled
    assert mixer(torch.zeros(1, 1, dtype=torch.long), scores) is scores  # the processor never changes sampling
    # token 4 was sampled: not the anchor; candidates (0, 5, 1), weights (.5, 1e-12, .2) / .7
    fed = embedding(torch.tensor([[4]]))[0, 0]
    w0, w1 = 0.5 / 0.7, 0.2 / 0.7
    assert fed.tolist() == pytest.approx([w0 * 1 + w1 * 2, w1 * 0.2], abs=1e-6)  # (1.2857, .0571), not (-1, 0)
    mixer(torch.zeros(1, 2, dtype=torch.long), scores)
    assert embedding(torch.tensor([[3]]))[0, 0].tolist() == [1.0, 1.0]  # "4 3" = think end: this token is plain
    mixer(torch.zeros(1, 3, dtype=torch.long), scores)
    assert embedding(torch.tensor([[0]]))[0, 0].tolist() == [1.0, 0.0]  # and every later one
    handle.remove()
    ids, weights = mixer.records(4)  # 3 fed tokens + the last one (never fed): stored unmixed
    assert ids[0, 0].tolist() == [0, 5, 1] and weights[0, 0].tolist() == pytest.approx([w0, 0.0, w1], abs=1e-6)
    assert weights[0, 1:].abs().sum() == 0
    assert embedding(torch.tensor([[4]]))[0, 0].tolist() == [-1.0, 0.0]  # hook removed: plain lookups


def test_mixing_draw_has_its_own_generator():
    embedding = torch.nn.Embedding.from_pretrained(TABLE.clone())
    mixers = [_mixer(embedding, rate=0.5, seed=3) for _ in range(2)]
    torch.manual_seed(0)
    expected = torch.rand(1)
    draws = []
    for mixer in mixers:
        torch.manual_seed(0)
        mixer(torch.zeros(64, 1, dtype=torch.long), torch.zeros(64, 6))
        draws.append(mixer.pending[2])
        assert torch.equal(torch.rand(1), expected)  # the global generator was not advanced
    assert torch.equal(draws[0], draws[1]) and 10 < draws[0].sum() < 54  # same seed, same rows; about half


def _tiny():
    model = __import__("transformers").AutoModelForCausalLM.from_pretrained(tiny_model_path()).eval()
    tok = load_tiny_tokenizer()
    prompt = torch.tensor([tok.encode("1+2=")] * 4)  # equal lengths: no padding
    return model, prompt


def _generate(model, prompt, processors):
    torch.manual_seed(0)
    return model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=True, max_new_tokens=8,
                          min_new_tokens=8, logits_processor=processors, pad_token_id=0)


class _Recorder:
    def __init__(self):
        self.scores = []

    def __call__(self, input_ids, scores):
        self.scores.append(scores.clone())
        return scores


def test_mix_rate_zero_is_plain_generation():
    model, prompt = _tiny()
    plain = _generate(model, prompt, [])
    mixer = _mixer(model.get_input_embeddings(), rate=0.0)
    handle = model.get_input_embeddings().register_forward_hook(mixer.hook)
    assert torch.equal(_generate(model, prompt, [mixer]), plain)
    handle.remove()
    assert mixer.records(8)[1].abs().sum() == 0


def test_a_mixer_that_fed_no_step_records_unmixed_rows():
    # one-token completions: the sampled token is never fed back, so nothing is recorded; B rows stay unmixed
    model, _ = _tiny()
    mixer = _mixer(model.get_input_embeddings(), rate=1.0)
    ids, weights = mixer.records(1, rows=4)
    assert ids.shape == (4, 1, mixer.top_k) and weights.shape == (4, 1, mixer.top_k) and weights.abs().sum() == 0
    with pytest.raises(ValueError, match="number of rows"):
        mixer.records(1)


def test_replay_gives_the_logits_the_rollout_was_sampled_from():
    model, prompt = _tiny()
    recorder, mixer = _Recorder(), _mixer(model.get_input_embeddings(), rate=0.5, seed=1)
    handle = model.get_input_embeddings().register_forward_hook(mixer.hook)
    sequences = _generate(model, prompt, [recorder, mixer])
    handle.remove()
    completion = sequences[:, prompt.size(1):]
    ids, weights = mixer.records(completion.size(1))
    mixed = weights.sum(-1) > 0
    assert mixed[:, :-1].any() and not mixed[:, :-1].all()  # some steps mixed, some not
    seen = torch.stack(recorder.scores, 1)  # (B, T, V) logits at generation time
    with torch.no_grad():
        plain = model(sequences).logits[:, prompt.size(1) - 1 : -1]
        with replaying(model.get_input_embeddings(), ids, weights):
            replayed = model(sequences).logits[:, prompt.size(1) - 1 : -1]
    finite = torch.isfinite(seen)  # generate's min_new_tokens sets the EOS logit to -inf
    assert finite.float().mean() > 0.9
    torch.testing.assert_close(replayed[finite], seen[finite], atol=1e-5, rtol=0)
    after_mix = torch.cat([torch.zeros_like(mixed[:, :1]), mixed[:, :-1]], 1)  # the position after a mixed input
    plain, seen = plain.masked_fill(~finite, 0), seen.masked_fill(~finite, 0)
    assert not torch.allclose(plain[after_mix], seen[after_mix], atol=1e-3)  # a plain forward is not what was seen
    torch.testing.assert_close(plain[:, 0], seen[:, 0], atol=1e-5, rtol=0)  # the first token: nothing mixed yet


def test_replay_refuses_a_forward_of_other_rows():
    embedding = torch.nn.Embedding.from_pretrained(TABLE.clone())
    with pytest.raises(RuntimeError, match="fed 1 rows for 2 mixing records"):
        with replaying(embedding, torch.zeros(2, 1, 2, dtype=torch.long), torch.zeros(2, 1, 2)):
            embedding(torch.tensor([[0, 1]]))


def test_filter_keeps_every_rollout_and_refuses_inf():
    rewards = torch.tensor([1.0, float("nan"), 0.0, 1.0])
    assert n_grpo(RolloutBatch(rewards, torch.ones(4), 2)).tolist() == [True] * 4
    assert n_grpo(RolloutBatch(torch.ones(1), torch.ones(1), 1)).tolist() == [True]  # group size 1
    with pytest.raises(ValueError, match="±inf"):
        n_grpo(RolloutBatch(torch.tensor([float("inf"), 0.0]), torch.ones(2), 2))


def _config(**kw):
    return trl_groupx.GRPOConfig(output_dir="/tmp/n_grpo", use_cpu=True, bf16=False, report_to="none",
                                 rollout_filter="n_grpo", **kw)


def test_defaults_are_the_official_settings():
    config = _config()
    assert (config.n_grpo_mix_rate, config.n_grpo_top_k, config.n_grpo_think_end) == (0.1, 2, "</think>")
    assert trl_groupx.get_variant("n_grpo").flags["n_grpo_mix_rate"] == 0.1


@pytest.mark.parametrize("flags, message", [
    ({"n_grpo_mix_rate": -0.1}, "n_grpo_mix_rate=-0.1: use a probability in"),
    ({"n_grpo_mix_rate": 1.5}, "n_grpo_mix_rate=1.5"),
    ({"n_grpo_mix_rate": math.nan}, "n_grpo_mix_rate=nan"),
    ({"n_grpo_top_k": 0}, "n_grpo_top_k=0: use an integer >= 1"),
    ({"n_grpo_top_k": -2}, "n_grpo_top_k=-2"),
    ({"n_grpo_think_end": ""}, "n_grpo_think_end=''"),
    ({"use_vllm": True}, r"which vLLM \(use_vllm\) does not do"),
    ({"use_transformers_continuous_batching": True}, "use_transformers_continuous_batching"),
    ({"generation_temperatures": [0.8, 1.0]}, "generation_temperatures"),
    ({"prefix_grouper": True}, "prefix_grouper"),
    ({"use_liger_kernel": True}, "use_liger_kernel"),
    ({"token_weighting": "otb"}, "token_weighting='otb' needs"),
])
def test_bad_flags_fail_at_config_time(flags, message):
    with pytest.raises(ValueError, match=message):
        _config(**{"num_generations": 2, **flags})


def test_fields_without_the_variant_fail():
    with pytest.raises(ValueError, match="n_grpo_top_k=3 belongs to variant 'n_grpo'"):
        trl_groupx.GRPOConfig(output_dir="/tmp/n_grpo", use_cpu=True, bf16=False, n_grpo_top_k=3)
    assert _config(n_grpo_mix_rate=0, n_grpo_top_k=1, n_grpo_think_end=None).n_grpo_mix_rate == 0  # edges accepted
