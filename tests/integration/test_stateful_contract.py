"""Every stateful variant of the registry, with its registry flags (the paper's defaults), resumes exactly: 3 steps
uninterrupted equal 2 steps, a checkpoint, and 1 resumed step (weights bit for bit, variant state equal); and each
one has a multi-process test. A variant that declares `stateful=True` joins both checks without an edit here; its
own test file checks what its state means."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import trl_groupx
from tests.conftest import assert_same_state, assert_same_weights, build_trainer
from trl_groupx.toy import tiny_model_path
from trl_groupx.trainer import VARIANT_STATE_NAME

# Variants whose registry flags make the trainer keep state of its own in `variant_state` (not the variant function):
# HAPO's adaptive-temperature entropy statistics, computed from one generation batch and used by the next.
TRAINER_STATE = {"hapo", "sppo", "srpo"}  # and SPPO's value model: its weights and optimizer state; SRPO's EMA
# self-teacher (the full-model copy under these flags; the LoRA adapter case: test_srpo_resume.py)
STATEFUL = sorted(v.id for v in trl_groupx.list_variants() if v.stateful or v.id in TRAINER_STATE)
INTEGRATION = Path(__file__).parent


def _settings(variant) -> dict:
    """Registry flags + what the tiny setting needs: the toy dataset's reference column, the LoRA base as reference."""
    flags = dict(variant.flags)
    if "gcpo_ref_column" in variant.params:
        flags["gcpo_ref_column"] = "answer"
    if "sppo_value_model" in variant.params:  # SPPO's value model: the tiny model with a new scalar head
        flags["sppo_value_model"] = tiny_model_path()
    if "s2l_po_explorer_model" in variant.params:  # S2L-PO's explorer: the tiny model itself
        flags["s2l_po_explorer_model"] = tiny_model_path()
    return flags


def _run(path: Path, variant, resume: str | None = None):
    peft = bool({"ref_logps", "reference_sample_rewards"} & set(variant.requires))
    trainer = build_trainer(trl_groupx.GRPOTrainer, trl_groupx.GRPOConfig, path, peft=peft, max_steps=3,
                            save_strategy="steps", save_steps=1, **_settings(variant))
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def test_the_registry_has_stateful_variants():
    assert {"ebpo", "vade", "spo_single"} <= set(STATEFUL)  # the contract below is not vacuous


@pytest.mark.parametrize("variant_id", STATEFUL)
def test_resume_continues_exactly(tmp_path, variant_id):
    variant = trl_groupx.get_variant(variant_id)
    full = _run(tmp_path / "full", variant)
    checkpoint = tmp_path / "full" / "checkpoint-2"
    saved = torch.load(checkpoint / VARIANT_STATE_NAME, weights_only=False)
    keys = [k for k in full.variant_state if k == variant_id or k.startswith(f"{variant_id}/")]
    assert keys and all(k in saved for k in keys), f"{variant_id}: its state is not in the checkpoint"
    resumed = _run(tmp_path / "resumed", variant, resume=str(checkpoint))
    assert resumed.state.global_step == full.state.global_step == 3
    for key in keys:
        assert_same_state(full.variant_state[key], resumed.variant_state[key], key)
    assert_same_weights(full, resumed)


@pytest.mark.parametrize("variant_id", STATEFUL)
def test_has_a_multiprocess_test(variant_id):
    """Stateful variants keep their state identical on every rank: each needs a torchrun worker that runs it."""
    workers = [p for p in INTEGRATION.glob("*mp*worker.py") if f'"{variant_id}"' in p.read_text()]
    cases = (INTEGRATION / "sharding_helpers.py").read_text()
    assert workers or f'"{variant_id}"' in cases, f"{variant_id}: no *_mp_worker.py runs it"
