"""SAGE-light (`rollout_filter="sage"`, `sage_method="light"`) on the tiny model: each prompt's hint level follows
its accuracy at its previous visit (up after a failed visit, down after a solved one), the group is generated once
from prompt ⊕ hint at that level (no re-roll), rewards see the prompt without the hint, the tracker is saved with
checkpoints and a resumed run continues exactly. The tiny model cannot write JSON: `TaggedLevels` (test_sage.py)
turns the policy's greedy reply into three levels."""

import pytest
import torch

import trl_groupx.sampling.self_hints as self_hints
from tests.conftest import assert_same_weights, grads_differ, one_step
from tests.integration.test_sage import SHORT, ScriptedReward, TaggedLevels, _template_ids, _user, ours
from trl_groupx.sampling.sage import LIGHT_STATE_KEY, prompt_digest
from trl_groupx.toy import arithmetic_dataset
from trl_groupx.trainer import VARIANT_STATE_NAME

DATASET = arithmetic_dataset(2, seed=0)  # batch 8, G 4: both prompts in every step
LIGHT = dict(rollout_filter="sage", sage_method="light", shuffle_dataset=False, **SHORT)


@pytest.fixture
def tagged(monkeypatch):
    parser = TaggedLevels()
    monkeypatch.setattr(self_hints, "parse_hint_levels", parser)
    return parser


def _light(tmp_path, reward=None, peft=False, **flags):
    return ours(tmp_path, peft, reward=reward or ScriptedReward(constant=0.0), dataset=DATASET, **{**LIGHT, **flags})


def _keys():
    return [prompt_digest(row["prompt"]) for row in DATASET]


def _logged(trainer, name):
    return [entry[name] for entry in trainer.state.log_history if name in entry]


def test_levels_follow_the_previous_visit(tmp_path, tagged):
    # every rollout fails: visit 1 unhinted, visit 2 at level 1, visit 3 at level 2
    reward = ScriptedReward(constant=0.0)
    trainer = _light(tmp_path, reward, max_steps=3)
    trainer.train()
    assert _logged(trainer, "groupx/sage_hinted_level_1") == [0.0, 1.0, 0.0]
    assert _logged(trainer, "groupx/sage_hinted_level_2") == [0.0, 0.0, 1.0]
    assert len(tagged.replies) == 4  # a fresh hint per hinted prompt and visit: 2 prompts × visits 2 and 3
    assert [len(call["prompts"]) for call in reward.calls] == [8, 8, 8]  # one generation per step, no re-roll
    assert all("Hint:" not in _user(p) for call in reward.calls for p in call["prompts"])  # rewards see x
    tracker = trainer.variant_state[LIGHT_STATE_KEY]
    assert sorted(tracker) == sorted(_keys())
    assert all(entry["level"] == 2 and entry["accuracy"] == 0.0 and entry["payload"]["level_2"] == "2"
               for entry in tracker.values())


def test_solved_prompts_step_down_and_accuracy_is_recorded(tmp_path, tagged):
    # both prompts were at level 2 with accuracy 0.5 > 0.35: this visit is at level 1; 1 of 4 rollouts solve now
    trainer = _light(tmp_path, ScriptedReward(alternate=True, zero_calls=0))
    old = {"level_1": "1old", "level_2": "2old", "level_3": "3old"}
    trainer.variant_state[LIGHT_STATE_KEY].update({k: {"level": 2, "accuracy": 0.5, "payload": old} for k in _keys()})
    one_step(trainer)
    tracker = trainer.variant_state[LIGHT_STATE_KEY]
    assert all(entry["level"] == 1 and entry["accuracy"] == 0.5 for entry in tracker.values())  # 2 of 4 rows solve
    assert all(entry["payload"]["level_2"] == "2" for entry in tracker.values())  # the fresh hint replaced the old


@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
def test_hinted_prompts_train_and_change_the_update(tmp_path, tagged, peft):
    plain = ours(tmp_path / "plain", peft, reward=ScriptedReward(zero_calls=0), dataset=DATASET, shuffle_dataset=False)
    _, base_grads, _ = one_step(plain)
    trainer = _light(tmp_path / "light", ScriptedReward(zero_calls=0), peft=peft)  # parity reward: a gradient
    trainer.variant_state[LIGHT_STATE_KEY].update({k: {"level": 0, "accuracy": 0.0, "payload": None}
                                                   for k in _keys()})
    _, grads, inputs = one_step(trainer)
    batch = next(iter(trainer.get_train_dataloader()))
    prompts = {_template_ids(trainer, [{"role": "user", "content": _user(x["prompt"]) + " Hint:1" + reply[:2]}])
               for x, reply in zip(batch[::4], tagged.replies)}
    seen = {tuple(p[m.bool()].tolist()) for p, m in zip(inputs["prompt_ids"], inputs["prompt_mask"])}
    assert seen == prompts  # every row under its prompt's level-1 hint
    assert grads_differ(base_grads, grads)


def test_unparsable_hint_falls_back_to_the_last_one(tmp_path, monkeypatch):
    monkeypatch.setattr(self_hints, "parse_hint_levels", lambda text: None)
    trainer = _light(tmp_path)
    first, second = _keys()
    old = {"level_1": "1old"}
    tracker = trainer.variant_state[LIGHT_STATE_KEY]
    tracker[first] = {"level": 0, "accuracy": 0.0, "payload": old}  # level 1 from its last hint
    tracker[second] = {"level": 1, "accuracy": 0.0, "payload": old}  # level 2: the last hint has no level 2
    _, _, inputs = one_step(trainer)
    texts = {trainer.processing_class.decode(p[m.bool()]) for p, m in zip(inputs["prompt_ids"], inputs["prompt_mask"])}
    assert sum(" Hint:1old" in t for t in texts) == 1 and len(texts) == 2
    assert tracker[first]["level"] == 1 and tracker[second]["level"] == 0  # the level actually applied
    assert tracker[first]["payload"] == old


def test_evaluation_is_never_hinted(tmp_path, tagged):
    trainer = _light(tmp_path, per_device_eval_batch_size=8)
    trainer.variant_state[LIGHT_STATE_KEY].update({k: {"level": 1, "accuracy": 0.0, "payload": None}
                                                   for k in _keys()})
    trainer.model.eval()
    batch = list(DATASET) * 4
    output = trainer._generate_and_score_completions(batch)
    assert tagged.replies == [] and all("Hint" not in trainer.processing_class.decode(p) for p in output["prompt_ids"])


def test_resume_continues_exactly(tmp_path, tagged):
    def run(path, resume=None):
        trainer = _light(path, ScriptedReward(constant=0.0), max_steps=3, save_strategy="steps", save_steps=1)
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    full = run(tmp_path / "full")
    checkpoint = tmp_path / "full" / "checkpoint-2"
    assert LIGHT_STATE_KEY in torch.load(checkpoint / VARIANT_STATE_NAME, weights_only=False)
    resumed = run(tmp_path / "resumed", str(checkpoint))
    assert resumed.variant_state[LIGHT_STATE_KEY] == full.variant_state[LIGHT_STATE_KEY]
    assert _logged(resumed, "groupx/sage_hinted_level_2")[-1] == 1.0
    assert_same_weights(full, resumed)
