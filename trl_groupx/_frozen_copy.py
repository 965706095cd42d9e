"""A frozen, detached copy of the policy whose forward calls the copy (a full-fine-tuning reference, teacher or
scaffold base that starts from the policy's current weights).

Why `copy.deepcopy` alone is wrong: TRL 1.16's `GRPOTrainer` gives the policy a fused LM head
(`trl.trainer.utils.add_fused_lm_head`), which replaces `model.forward` with an instance attribute: a method bound to
the model whose closure holds the model's original bound forward. `copy.deepcopy` copies the instance attribute,
rebinding the method to the copy but not the closure, so the copy's ordinary forward (`fused_lm_head=False`: plain
logits, `generate`) still runs the policy's original forward: the policy's weights, not the copy's, with gradients
flowing into the policy. Removing the instance attribute gives the copy its class's own forward on its own weights.
"""

from __future__ import annotations

import copy

import torch


def frozen_policy_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of `model` (the unwrapped policy, not a PEFT model) with `requires_grad` off on every parameter
    and its class's own forward, so calling it never runs the policy (see the module docstring).

    The copy has no fused head: a caller that needs one adds its own (`add_fused_lm_head(copy, ...)`). It keeps the
    policy's dtypes, device and train/eval mode; callers that only evaluate it call `.eval()`.
    """
    frozen = copy.deepcopy(model)
    vars(frozen).pop("forward", None)  # TRL's fused-head forward, whose closure calls the policy
    return frozen.requires_grad_(False)
