"""SRPO's EMA self-teacher is saved with every checkpoint and restored on resume: 3 uninterrupted steps equal 2 steps,
a checkpoint and 1 resumed step, for the teacher's weights (the LoRA teacher adapter and its EMA shadow, or the
full-model copy) and for the policy. Without the saved state the resumed teacher would restart (from a zero adapter,
or from the initial model) and differ after the resumed step."""

from __future__ import annotations

import pytest
import torch
from transformers import TrainerCallback

from tests.conftest import assert_same_weights
from tests.integration.objective_helpers import ours
from trl_groupx.objective.self_teacher import STATE_KEY, TEACHER_ADAPTER
from trl_groupx.trainer import VARIANT_STATE_NAME

# rate 0.25 (not 0.05): each step moves the teacher visibly, so a teacher restarted on resume cannot match
SETTINGS = dict(loss_type="srpo", srpo_teacher_update_rate=0.25, max_steps=3, save_strategy="steps", save_steps=1)


def teacher_weights(trainer) -> dict[str, torch.Tensor]:
    """The weights the teacher forward runs with: the copy's, or the teacher adapter's parameters in the model."""
    teacher = trainer._self_teacher
    if teacher.copy is not None:
        return {k: v.detach().clone() for k, v in teacher.copy.state_dict().items()}
    model = trainer.accelerator.unwrap_model(trainer.model)
    return {n: p.detach().clone() for n, p in model.named_parameters() if f".{TEACHER_ADAPTER}." in n}


class _RecordTeacher(TrainerCallback):
    """The teacher's weights after each optimizer step, and at the start of each step (before its generation
    batch); added after the trainer's own callbacks, so it runs after them."""

    def __init__(self, trainer):
        self.trainer, self.by_step, self.at_begin = trainer, {}, {}

    def on_step_begin(self, args, state, control, **kwargs):
        self.at_begin[state.global_step] = teacher_weights(self.trainer)

    def on_step_end(self, args, state, control, **kwargs):
        self.by_step[state.global_step] = teacher_weights(self.trainer)


def _run(path, peft, resume=None):
    trainer = ours(path, peft, **SETTINGS)
    record = _RecordTeacher(trainer)
    trainer.add_callback(record)
    trainer.train(resume_from_checkpoint=resume)
    return trainer, record


def _assert_equal(a: dict, b: dict, where: str) -> None:
    assert a.keys() == b.keys() and a, where
    for key in a:
        assert torch.equal(a[key].cpu(), b[key].cpu()), f"{where}: {key}"


@pytest.mark.parametrize("peft", [False, True], ids=["full_copy", "lora_adapter"])
def test_resumed_teacher_equals_the_uninterrupted_one(tmp_path, peft):
    full, record = _run(tmp_path / "full", peft)
    full_steps = record.by_step
    assert sorted(full_steps) == [1, 2, 3]
    # the teacher moves every step: equal teachers at step 3 are not the trivial case
    assert any(not torch.equal(full_steps[2][k], full_steps[3][k]) for k in full_steps[3])

    # checkpoint-2 holds the step-2 teacher (for LoRA: the EMA shadow, in PEFT's key names)
    saved = torch.load(tmp_path / "full" / "checkpoint-2" / VARIANT_STATE_NAME, weights_only=True)[STATE_KEY]
    if peft:
        shadow = {k.replace(".weight", f".{TEACHER_ADAPTER}.weight"): v for k, v in saved["weights"].items()}
        assert shadow.keys() == full_steps[2].keys()
        _assert_equal(shadow, full_steps[2], "checkpoint-2 shadow")
    else:
        _assert_equal(saved["weights"], full_steps[2], "checkpoint-2 copy")

    resumed, record = _run(tmp_path / "resumed", peft, resume=str(tmp_path / "full" / "checkpoint-2"))
    resumed_steps = record.by_step
    assert sorted(resumed_steps) == [3] and resumed.state.global_step == 3
    # restored when the resumed step begins, before its generation batch runs the teacher
    _assert_equal(record.at_begin[2], full_steps[2], "teacher when the resumed step begins")
    _assert_equal(resumed_steps[3], full_steps[3], "teacher after the resumed step")
    _assert_equal(resumed._self_teacher.state["weights"], full._self_teacher.state["weights"], "saved state")
    assert_same_weights(full, resumed)


def test_a_checkpoint_without_the_teacher_keeps_the_live_one_and_saves_it_again(tmp_path):
    # what `_load_optimizer_and_scheduler` leaves for a key the checkpoint lacks: an empty dict
    trainer = ours(tmp_path, loss_type="srpo")
    teacher = trainer._self_teacher
    before = teacher_weights(trainer)
    trainer.variant_state[STATE_KEY].clear()
    teacher.sync()
    _assert_equal(teacher_weights(trainer), before, "teacher")
    live = teacher.copy.state_dict()
    assert teacher.state["weights"].keys() == live.keys()
    assert all(teacher.state["weights"][k].data_ptr() == live[k].data_ptr() for k in live)  # the live tensors


def test_live_and_base_teachers_keep_no_state(tmp_path):
    # "live" is the policy itself; "base" is the initial model, rebuilt from the same model on resume
    for kind in ("live", "base"):
        trainer = ours(tmp_path / kind, loss_type="srpo", srpo_teacher_kind=kind)
        assert STATE_KEY not in trainer.variant_state
