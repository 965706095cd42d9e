"""The model-backed components: LMJudge's P(yes)/(P(yes)+P(no)) on a model whose head fixes the logits, its
padding invariance and template rendering on the shipped tiny model; EmbeddingSimilarityScorer's mean-pooled cosine
on a model whose hidden states are a fixed table (hand-checkable), padding and special tokens never pooled, empty
completions; the argument errors; and the `lm_judge:` / `embedding:` names a recipe can use."""

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from trl_groupx import GRPOConfig
from trl_groupx.advantages import allneg_aifeedback, dagrpo
from trl_groupx.advantages.lm_components import (
    DEFAULT_JUDGE_TEMPLATE,
    EmbeddingSimilarityScorer,
    LMJudge,
    message_text,
)
from trl_groupx.toy import load_tiny_model, load_tiny_tokenizer, tiny_model_path

USER = [{"role": "user", "content": "12+7="}]


def _answer(text):
    return [{"role": "assistant", "content": text}]


def fixed_head_model(tokenizer, yes, no, yes_logit, no_logit, other=None):
    """The tiny model with its LM head replaced by a zero-weight Linear whose bias is the logits: every position
    predicts `yes_logit` for `yes`, `no_logit` for `no`, 0 elsewhere (`other`: (token, logit) put elsewhere)."""
    model = load_tiny_model()
    head = nn.Linear(model.config.hidden_size, len(tokenizer), bias=True)
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    with torch.no_grad():
        head.bias[tokenizer.convert_tokens_to_ids(yes)] = yes_logit
        head.bias[tokenizer.convert_tokens_to_ids(no)] = no_logit
        if other is not None:
            head.bias[tokenizer.convert_tokens_to_ids(other[0])] = other[1]
    model.lm_head = head
    return model


# ---------------------------------------------------------------- LMJudge


def test_judge_score_is_yes_over_yes_plus_no():
    tok = load_tiny_tokenizer()
    # z_yes - z_no = ln 3 -> P(yes)/(P(yes)+P(no)) = 3/(3+1) = 0.75, however much mass "7" takes (logit 9).
    model = fixed_head_model(tok, "Y", "N", math.log(3.0), 0.0, other=("7", 9.0))
    judge = LMJudge(model, tok, template="{prompt}{completion}", yes_token="Y", no_token="N")
    scores = judge([USER] * 3, [_answer("19"), _answer(""), _answer("123")])
    assert scores == pytest.approx([0.75] * 3, abs=1e-6)
    # swapped tokens: 1/(1+3) = 0.25
    judge = LMJudge(model, tok, template="{prompt}{completion}", yes_token="N", no_token="Y")
    assert judge([USER], [_answer("19")]) == pytest.approx([0.25], abs=1e-6)


def test_judge_scores_depend_on_the_response_and_padding_changes_none():
    tok, model = load_tiny_tokenizer(), load_tiny_model()
    judge = LMJudge(model, tok, template="{prompt}{completion}", yes_token="1", no_token="0", batch_size=8)
    completions = [_answer(t) for t in ("19", "18", "1", "1234567")]  # lengths 2..7: rows padded by up to 6
    batched = judge([USER] * 4, completions)
    alone = [LMJudge(model, tok, template="{prompt}{completion}", yes_token="1", no_token="0")([USER], [c])[0]
             for c in completions]
    torch.testing.assert_close(torch.tensor(batched), torch.tensor(alone), rtol=0, atol=1e-6)
    assert len(set(round(s, 4) for s in batched)) == 4 and all(0 < s < 1 for s in batched)
    # the same score from the model's own softmax over the full vocabulary, read at the last token
    ids = tok.apply_chat_template([{"role": "user", "content": "12+7=19"}], add_generation_prompt=True,
                                  tokenize=False)
    with torch.no_grad():
        p = model(torch.tensor([tok.encode(ids, add_special_tokens=False)])).logits[0, -1].softmax(-1)
    y, n = tok.convert_tokens_to_ids("1"), tok.convert_tokens_to_ids("0")
    assert batched[0] == pytest.approx((p[y] / (p[y] + p[n])).item(), abs=1e-6)


def test_judge_runs_without_grad_and_restores_training_mode():
    tok, model = load_tiny_tokenizer(), load_tiny_model()
    model.train()
    judge = LMJudge(model, tok, template="{prompt}{completion}", yes_token="1", no_token="0", batch_size=1)
    assert len(judge([USER] * 3, [_answer("1"), _answer("2"), _answer("3")])) == 3
    assert model.training and all(p.grad is None for p in model.parameters())


def test_judge_template_rendering_and_dataset_columns():
    tok = load_tiny_tokenizer()
    model = fixed_head_model(tok, "Y", "N", 0.0, 0.0)
    judge = LMJudge(model, tok, template="Q {prompt} R {completion} ref {answer} {literal-braces}", yes_token="Y",
                    no_token="N")
    prompt = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+{completion}="}]
    # system message left out; a value's braces are not placeholders; unknown forms like {literal-braces} stay
    assert judge.questions([prompt], ["x"], answer=["2"]) == ["Q 1+{completion}= R x ref 2 {literal-braces}"]
    with pytest.raises(ValueError, match=r"\{answer\} name no dataset column"):
        judge([prompt], ["x"], solution=["2"])
    assert judge([prompt], ["x"], answer=[2]) == [0.5]  # equal logits: 1/2
    # chat template: the question is one user turn followed by the assistant prefix
    text = tok.decode(judge._encode("hi"))
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    raw = LMJudge(model, tok, template="{prompt}{completion}", yes_token="Y", no_token="N", use_chat_template=False)
    assert tok.decode(raw._encode("hi")) == "hi"
    assert message_text([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]) == "a\n\nb"
    # a question with no token (bare template, empty prompt and response, no BOS): unscored, the others are scored
    assert raw(["", "1"], ["", "2"]) == [None, 0.5]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"yes_token": "yes"}, r"yes_token='yes' is not one token"),  # three characters in the tiny vocabulary
        ({"no_token": "é"}, r"no_token='é' is not one token"),  # unknown character: <unk>
        ({"no_token": 1000}, r"no_token=1000 is not one token"),
        ({"yes_token": ""}, r"yes_token must be a non-empty string"),
        ({"yes_token": "Y", "no_token": "Y"}, r"are the same token"),
        ({"template": "{prompt} only"}, r"template lacks the placeholder\(s\) \{completion\}"),
        ({"template": "nothing"}, r"\{prompt\}, \{completion\}"),
        ({"batch_size": 0}, r"batch_size must be a positive integer"),
    ],
)
def test_judge_argument_errors(kwargs, match):
    tok = load_tiny_tokenizer()
    args = {"template": "{prompt}{completion}", "yes_token": "Y", "no_token": "N", **kwargs}
    with pytest.raises(ValueError, match=match):
        LMJudge(load_tiny_model(), tok, **args)


def test_default_template_and_tokens_need_yes_and_no_tokens():
    assert "{prompt}" in DEFAULT_JUDGE_TEMPLATE and "{completion}" in DEFAULT_JUDGE_TEMPLATE
    with pytest.raises(ValueError, match="yes_token='Yes'"):  # the tiny vocabulary is character-level
        LMJudge(load_tiny_model(), load_tiny_tokenizer())


# ---------------------------------------------------------------- EmbeddingSimilarityScorer


class TableModel(nn.Module):
    """Hidden state of a token = its row of a fixed table, whatever its context: mean pooling is hand-checkable."""

    def __init__(self, table):
        super().__init__()
        self.table = nn.Parameter(torch.tensor(table, dtype=torch.float32))

    def forward(self, input_ids, attention_mask=None, output_hidden_states=False, **kwargs):
        return SimpleNamespace(last_hidden_state=self.table[input_ids])


#        pad (0)       e1           e2          -e1           e1+e2        BOS (5)
TABLE = [[0, 0, 100], [1, 0, 0], [0, 1, 0], [-1, 0, 0], [1, 1, 0], [0, 0, 50]]


def test_embedding_similarity_hand_checked():
    scorer = EmbeddingSimilarityScorer(TableModel(TABLE))  # tokenizer None: the policy's ids as they are
    ids = [[1], [2], [3], [1, 2], [1, 1, 2], [4], [1, 2]]
    sim = scorer(["a"] * 7, ids)
    assert sim[0][1] == 0.0  # e1 . e2 = 0: orthogonal
    assert sim[0][2] == 0.0  # cos(e1, -e1) = -1, clipped to 0
    assert sim[0][3] == pytest.approx(1 / math.sqrt(2))  # mean (e1+e2)/2 against e1
    assert sim[4][5] == pytest.approx(3 / math.sqrt(10))  # (2e1+e2)/3 . (e1+e2) / norms = 3/(sqrt5 sqrt2)
    assert sim[3][5] == pytest.approx(1.0)  # (e1+e2)/2 and e1+e2: same direction
    assert sim[3][6] == 1.0 and all(sim[i][i] == 1.0 for i in range(7))  # identical sequences: exactly 1
    assert sim == [list(r) for r in zip(*sim, strict=True)]  # symmetric
    # the pad row (100 e3) is never pooled: [1] padded to length 3 keeps e1
    assert torch.equal(scorer.embeddings(["a"], [[1]]), scorer.embeddings(["a", "b"], [[1], [1, 1, 2]])[:1])


def test_empty_completion_is_unscored_and_batches_agree():
    sim = EmbeddingSimilarityScorer(TableModel(TABLE), batch_size=2)(["", "a", "b"], [[], [1], [1, 2]])
    assert sim[0] == [None, None, None] and [r[0] for r in sim] == [None, None, None]
    assert sim[1][2] == pytest.approx(1 / math.sqrt(2))


class BosTokenizer:
    """Maps 'a' -> 1, 'b' -> 2 and prepends BOS (5) as a special token."""

    pad_token_id = 0

    def __call__(self, texts, add_special_tokens=True, return_special_tokens_mask=False):
        ids = [[5] + [{"a": 1, "b": 2}[c] for c in t] for t in texts]
        return {"input_ids": ids, "special_tokens_mask": [[1] + [0] * (len(r) - 1) for r in ids]}


def test_special_tokens_are_not_pooled():
    # pooling BOS (50 e3) would make "a" and "b" nearly parallel; left out, they are e1 and e2: orthogonal
    sim = EmbeddingSimilarityScorer(TableModel(TABLE), BosTokenizer())(["a", "b", "ab"], [[9], [9], [9]])
    assert sim[0][1] == 0.0 and sim[0][2] == pytest.approx(1 / math.sqrt(2))


def test_embedding_on_the_tiny_causal_lm_reads_no_padding():
    tok, model = load_tiny_tokenizer(), load_tiny_model()
    texts = ["19", "18", "19", "1234567"]
    ids = [tok.encode(t, add_special_tokens=False) for t in texts]
    scorer = EmbeddingSimilarityScorer(model, tok)
    sim = scorer(texts, ids)
    assert sim[0][2] == 1.0 and 0 < sim[0][1] < 1 and sim[0][3] < sim[0][1]
    assert scorer._from_hidden_states  # a causal LM has no last_hidden_state: the last of its hidden_states
    alone = torch.cat([scorer.embeddings([t], [i]) for t, i in zip(texts, ids, strict=True)])
    torch.testing.assert_close(scorer.embeddings(texts, ids), alone, rtol=0, atol=1e-5)
    # re-tokenising the text and reading the policy's ids give the same numbers (same vocabulary, no specials)
    torch.testing.assert_close(torch.tensor(EmbeddingSimilarityScorer(model)(texts, ids)), torch.tensor(sim))
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        EmbeddingSimilarityScorer(model, batch_size=-1)


# ---------------------------------------------------------------- names a recipe can use


def yes_no_model_dir(tmp_path):
    """The tiny model with 'Yes' and 'No' added to its vocabulary, saved to a folder."""
    tok, model = load_tiny_tokenizer(), load_tiny_model()
    tok.add_tokens(["Yes", "No"])
    model.resize_token_embeddings(len(tok))
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    return str(tmp_path)


def test_model_names_validate_without_loading_and_build_on_first_use(tmp_path):
    path = yes_no_model_dir(tmp_path / "judge")
    name = "lm_judge:" + path
    GRPOConfig(output_dir=str(tmp_path), use_cpu=True, num_generations=2, per_device_train_batch_size=2,
               advantage_estimator="allneg_aifeedback", allneg_aifeedback_judge=name)
    assert name not in allneg_aifeedback.JUDGES._judges  # checking the name loaded nothing
    judge = allneg_aifeedback.JUDGES.get(name)
    assert isinstance(judge, LMJudge) and allneg_aifeedback.JUDGES.get(name) is judge  # built once
    assert judge.template == DEFAULT_JUDGE_TEMPLATE and judge.model.device.type in ("cpu", "cuda")
    scores = judge([USER], [_answer("19")])
    assert len(scores) == 1 and 0 <= scores[0] <= 1

    scorer = dagrpo.SCORERS.get("embedding:" + tiny_model_path())
    assert isinstance(scorer, EmbeddingSimilarityScorer)
    assert scorer(["19", "19"], [[0], [0]])[0][1] == 1.0
    assert scorer._from_hidden_states is False  # AutoModel: last_hidden_state, no per-layer hidden states built
    # the base model's last_hidden_state is the causal LM's last hidden state: the same similarities
    causal = EmbeddingSimilarityScorer(load_tiny_model(), load_tiny_tokenizer())
    texts = ["19", "18", "7"]
    torch.testing.assert_close(torch.tensor(scorer(texts, [[0]] * 3)), torch.tensor(causal(texts, [[0]] * 3)))


@pytest.mark.parametrize(("flags", "match"), [
    ({"advantage_estimator": "allneg_aifeedback", "allneg_aifeedback_judge": "lm_judge: "},
     r"allneg_aifeedback_judge='lm_judge: ' names no model"),
    ({"advantage_estimator": "dagrpo", "dagrpo_scorer": "embedding:"}, r"dagrpo_scorer='embedding:' names no model"),
    ({"advantage_estimator": "dagrpo", "dagrpo_scorer": "embeddings"},
     r"dagrpo_scorer='embeddings' is not registered.* Or name a model: embedding:<model folder or hub id>"),
])
def test_model_names_refused_at_config_construction(tmp_path, flags, match):
    with pytest.raises(ValueError, match=match):
        GRPOConfig(output_dir=str(tmp_path), use_cpu=True, num_generations=2, per_device_train_batch_size=2, **flags)
