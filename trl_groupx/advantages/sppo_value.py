"""SPPO's value model `V(x)` (requirement `prompt_value_logits`): a causal LM with a scalar head, scored on the prompt
alone and trained with binary cross-entropy against the rewards, by its own optimizer, once per generation batch.

Official code (sustech-nlp/SPPO@55e8a7236dabbd7c421ab987eebeb1a067b4c436):

- model: `verl/workers/fsdp_workers.py:_build_critic_model_optimizer` (l.1238-1270) loads the critic as
  `AutoModelForTokenClassification` with `num_labels = 1` and dropout 0 (`verl/utils/model.py:load_valuehead_model`,
  l.617-628): the pretrained backbone plus a new linear head on the last hidden state. The run scripts start it
  from the policy's checkpoint (`critic.model.path`), or from a smaller model of the same family
  (`run_R1-7B_DAPO_SEQUENCE_small_critic.sh`).
- value: `verl/workers/critic/dp_critic.py:_forward_prompt_value` (l.54-84), the head's logit at the last position
  of the (left-padded) prompt, with position ids counted from the prompt's first real token; `compute_values`
  (l.104-157) runs it on the prompts only, without grad.
- loss: `update_critic` (l.160-255), `BCEWithLogitsLoss(V(x), R)` (l.52, 226-228), mean over each mini-batch
  (`ppo_mini_batch_size` rows, one optimizer step each, in batch order), gradient-norm clip 1.0, the step skipped
  when the norm is not finite (`_optimizer_step`, l.85-101). Optimizer: AdamW, lr `critic.optim.lr` (5e-6 in
  `run_ds1.5B_PPO_SEQUENCE_shuffle.sh`), betas (0.9, 0.999), weight decay 0.01 (`fsdp_workers.py` l.1384-1390,
  `verl/trainer/config/critic/critic.yaml`, `dp_critic.yaml` grad_clip 1.0).
- order: values before the critic's update, the advantage from them, then the critic's update, then the actor's
  (`verl/trainer/ppo/ray_trainer.py:fit`, l.1156-1214).

Choices: the value model is kept in float32 (its optimizer's weights; forwards run under the trainer's autocast) and
replicated on every process (not sharded by DeepSpeed/FSDP, not gradient-checkpointed: it reads prompts only); its
head is initialised from `seed` inside a forked RNG, so every process starts from the same head and the policy's
random stream is untouched; the optimizer's betas, weight decay and clip are the official constants above, the
learning rate is `sppo_value_lr` and the mini-batch `sppo_value_mini_batch_size` (None = the whole generation batch:
one step per batch). Unscored rollouts (NaN reward) are left out of the BCE and of its mean. Each process computes
the BCE gradient of its own rows, the gradients are summed over processes before the clip and the step, so every
process takes the same update. The weights and the optimizer state live in `variant_state["sppo/value_model"]`
(saved with every checkpoint, restored before the next generation batch).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

VALUE_STATE_KEY = "sppo/value_model"
VALUE_BETAS = (0.9, 0.999)  # official AdamW betas (fsdp_workers.py l.1387)
VALUE_WEIGHT_DECAY = 0.01  # official critic.optim.weight_decay
VALUE_MAX_GRAD_NORM = 1.0  # official critic.grad_clip


def last_prompt_token_logits(model: torch.nn.Module, prompt_ids: torch.Tensor,
                             prompt_mask: torch.Tensor) -> torch.Tensor:
    """`(B,)` the scalar head's logit at each prompt's last real token; position ids count real tokens only, so the
    padding (left or right) is never read and does not shift the positions."""
    position_ids = (prompt_mask.long().cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=position_ids, use_cache=False).logits
    last = prompt_mask.size(1) - 1 - prompt_mask.long().flip(-1).argmax(-1)  # last 1 of each row's mask
    return logits[torch.arange(prompt_ids.size(0), device=logits.device), last, 0].float()


class PromptValueModel:
    """The value model, its AdamW and its checkpointed state; `logits` scores prompts, `update` takes the BCE steps.

    Args:
        model: a `*ForTokenClassification` model with one label (float32, on the trainer's device).
        state: the trainer's `variant_state[VALUE_STATE_KEY]` dict, kept pointing at the live weights and
            optimizer state (so a checkpoint saves them) and read back when a checkpoint replaced it.
        lr: `sppo_value_lr`. mini_batch_size: `sppo_value_mini_batch_size` (None = whole batch).
        micro_batch_size: rows per forward (the trainer's `per_device_train_batch_size`).
        accelerator: the trainer's `Accelerator` (device, autocast, processes).
    """

    def __init__(self, model: torch.nn.Module, state: dict[str, Any], *, lr: float, mini_batch_size: int | None,
                 micro_batch_size: int, accelerator: Any) -> None:
        self.model = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=VALUE_BETAS,
                                           weight_decay=VALUE_WEIGHT_DECAY)
        self.state = state
        self.mini_batch_size = mini_batch_size
        self.micro_batch_size = max(1, micro_batch_size)
        self.accelerator = accelerator
        self._published: Any = None
        self.publish()

    # ---- checkpointed state ------------------------------------------------------------------------------------

    def publish(self) -> None:
        """Point the state at the live weights and optimizer state (tensors shared, so a later save sees updates)."""
        self.state["model"] = self.model.state_dict()
        self.state["optimizer"] = self.optimizer.state_dict()
        self._published = self.state["model"]

    def sync(self) -> None:
        """Load the state into the model and optimizer when a resumed checkpoint replaced it."""
        if self.state.get("model") is self._published or "model" not in self.state:
            return
        self.model.load_state_dict(self.state["model"])
        self.optimizer.load_state_dict(self.state["optimizer"])
        self.publish()

    # ---- value and update --------------------------------------------------------------------------------------

    def logits(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
        """`(B,)` no-grad value logits `V(x)` of these prompts."""
        out = []
        with torch.no_grad(), self.accelerator.autocast():
            for i in range(0, prompt_ids.size(0), self.micro_batch_size):
                sl = slice(i, i + self.micro_batch_size)
                out.append(last_prompt_token_logits(self.model, prompt_ids[sl], prompt_mask[sl]))
        return torch.cat(out) if out else prompt_ids.new_zeros(0, dtype=torch.float32)

    def update(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, rewards: torch.Tensor,
               start: int) -> dict[str, float]:
        """BCE steps on the global generation batch, this process holding rows `start … start + B − 1`.

        `rewards (N,)` global, in [0, 1] or NaN (left out). Mini-batch `m` covers global rows
        `[m·M, (m+1)·M)`; its loss is `Σ BCE / n_m` over its `n_m` scored rows, each process adding the gradient of
        its own rows; summed over processes, clipped to norm 1, stepped (skipped when the norm is not finite or
        `n_m = 0`). Returns the mean pre-step BCE and `σ(V)` over the scored rows, and the number of steps taken.
        """
        from .sppo import check_unit_interval_rewards

        check_unit_interval_rewards(rewards)
        n, local_n = rewards.numel(), prompt_ids.size(0)
        size = self.mini_batch_size or n
        scored = ~torch.isnan(rewards)
        totals = torch.zeros(2, device=prompt_ids.device)  # Σ BCE, Σ σ(V) over this process's scored rows
        steps = 0
        for lo in range(0, n, size):
            hi = min(lo + size, n)
            count = int(scored[lo:hi].sum())
            if count == 0:
                continue
            self.optimizer.zero_grad(set_to_none=True)
            rows = torch.arange(max(lo, start), min(hi, start + local_n), device=rewards.device)
            rows = rows[scored[rows]] - start if rows.numel() else rows
            for i in range(0, rows.numel(), self.micro_batch_size):
                idx = rows[i : i + self.micro_batch_size].to(prompt_ids.device)
                with self.accelerator.autocast():
                    logit = last_prompt_token_logits(self.model, prompt_ids[idx], prompt_mask[idx])
                target = rewards[idx + start].to(logit)
                loss = F.binary_cross_entropy_with_logits(logit, target, reduction="sum")
                (loss / count).backward()
                totals += torch.stack([loss.detach(), torch.sigmoid(logit.detach()).sum()]).to(totals)
            self._sum_gradients_over_processes()
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), VALUE_MAX_GRAD_NORM)
            if torch.isfinite(norm):
                self.optimizer.step()
                steps += 1
            self.optimizer.zero_grad(set_to_none=True)
        self.publish()
        if self.accelerator.num_processes > 1:
            totals = self.accelerator.reduce(totals, reduction="sum")
        count = max(1, int(scored.sum()))
        return {"value_loss": totals[0].item() / count, "value_prob_mean": totals[1].item() / count,
                "value_steps": float(steps)}

    def _sum_gradients_over_processes(self) -> None:
        if self.accelerator.num_processes == 1:
            return
        import torch.distributed as dist

        for p in self.model.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)


def load_value_model(trainer: Any) -> PromptValueModel:
    """The value model of an SPPO run, from `sppo_value_model` (same tokenizer as the policy, checked), with a new
    scalar head (or the checkpoint's own one-label head), registered in `trainer.variant_state`."""
    from accelerate.utils import is_peft_model
    from transformers import AutoConfig, AutoModelForTokenClassification
    from trl.trainer.utils import disable_dropout_in_model

    from ..objective.dgrpo import check_teacher_tokenizer, check_teacher_vocab

    args = trainer.args
    path = args.sppo_value_model
    if path is None:
        raise ValueError(
            "advantage_estimator='sppo' learns the prompt value V(x) with a separate value model, but "
            "sppo_value_model is not set: pass the model id or local path of a causal LM with the policy's tokenizer "
            "(the official runs start it from the policy's own checkpoint)."
        )
    check_teacher_tokenizer(path, trainer.processing_class, trust_remote_code=args.trust_remote_code,
                            flag="sppo_value_model", role="value model")
    with torch.random.fork_rng(devices=[]):  # the same new head on every process; the policy's stream untouched
        torch.manual_seed(args.seed)
        try:
            config = AutoConfig.from_pretrained(path, num_labels=1, trust_remote_code=args.trust_remote_code)
            config.classifier_dropout = 0.0  # official: no dropout in the critic (fsdp_workers.py l.1258-1261)
            model = AutoModelForTokenClassification.from_pretrained(
                path, config=config, dtype=torch.float32, trust_remote_code=args.trust_remote_code)
        except (OSError, ValueError) as err:
            raise ValueError(
                f"sppo_value_model={path!r} could not be loaded as a value model ({err}); pass a model id or a local "
                "folder of a causal LM whose architecture has a *ForTokenClassification class (Llama, Qwen2, ...)."
            ) from err
    student = trainer.accelerator.unwrap_model(trainer.model)
    student = student.get_base_model() if is_peft_model(student) else student
    check_teacher_vocab(path, model, student, flag="sppo_value_model", role="value model")
    if args.disable_dropout:
        disable_dropout_in_model(model)
    model.eval()  # no dropout in the value (official: dropout 0); gradients still flow in `update`
    model.to(trainer.accelerator.device)
    state = trainer.variant_state.setdefault(VALUE_STATE_KEY, {})
    return PromptValueModel(model, state, lr=args.sppo_value_lr, mini_batch_size=args.sppo_value_mini_batch_size,
                            micro_batch_size=args.per_device_train_batch_size, accelerator=trainer.accelerator)


def prompt_value_logits(trainer: Any, output: dict[str, Any], rewards: torch.Tensor) -> torch.Tensor:
    """Requirement `prompt_value_logits`: the global `(N,)` value logits of the batch's prompts, computed before the
    value model's update; in training, the value model then takes its BCE steps on this batch (logged as
    `groupx/sppo_value_loss`, `groupx/sppo_value_prob_mean`)."""
    value = trainer._sppo_value
    value.sync()
    local = value.logits(output["prompt_ids"], output["prompt_mask"])
    logits = trainer.accelerator.gather(local) if trainer.accelerator.num_processes > 1 else local
    if trainer.model.training:
        start = trainer.accelerator.process_index * output["prompt_ids"].size(0)
        stats = value.update(output["prompt_ids"], output["prompt_mask"], rewards.to(logits.device), start)
        trainer._metrics["train"]["groupx/sppo_value_loss"].append(stats["value_loss"])
        trainer._metrics["train"]["groupx/sppo_value_prob_mean"].append(stats["value_prob_mean"])
    return logits
