"""`GRPOTrainer`: TRL's trainer with one seam per pipeline stage; the variants are pure functions elsewhere.

Seams (each wraps the narrowest TRL 1.16 internal; `tests/test_trl_seams.py` fails loudly if TRL moves them):

- rewards: `_calculate_rewards` is wrapped to keep the gathered `(N, K)` reward matrix.
- sampling, advantages, token weights: `_generate_and_score_completions` runs TRL's method unchanged, then
  `apply_rollout_stages` filters rollouts, recomputes the advantages over the global batch and turns them into
  per-token advantages, and writes this process's slice back into the output. A sampling variant that acts around
  generation (rewrites prompts, regenerates or appends rows) declares where in `sampling/generation_hooks.py`.
- objective: `_compute_loss` defers to TRL for TRL's `loss_type`s and to `compute_objective_loss` for ours.

With no trl_groupx flag set, none of this runs and training is TRL's, number for number; only the reward functions
are checked (a missing dataset column at construction; an exception, a non-numeric or an infinite reward at the call,
each named; see `reward_checks.py`).
"""

from __future__ import annotations

import copy
import functools
import os
from typing import Any

import torch
import trl
from accelerate.utils import gather_object
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl.trainer.utils import use_adapter

from .advantages import decoupled_normalized_advantages, group_normalized_advantages
from .advantages.step_credit import StepBatch, state_key, step_to_token_advantages, turn_index_from_tool_mask
from .config import GRPOConfig
from .contracts import ObjectiveContext, RolloutBatch, TokenContext, config_kwargs
from .model_card import ModelCardMixin
from .objective import TRL_REFERENCE_SURROGATE, aggregate, log_ratio, resolved_aggregation
from .objective.aggregation import balanced_sequence_scale
from .objective.kl import kl_coefficient
from .objective.kl import per_token_kl as per_token_kl_fn
from .registry import Variant, get_variant
from .reward_checks import check_reward_columns, wrap_reward_funcs
from .sampling import apply_keep_mask
from .sampling.baseline_rollouts import BASELINE_REQUIREMENTS, baseline_rewards, check_baseline_rollouts
from .sampling.generation_hooks import GenerationHooks
from .trainer_checks import check_model_for_flags, check_variant_components

VARIANT_STATE_NAME = "trl_groupx_variant_state.pt"

# Model inputs that `_get_per_token_logps_and_entropies` forwards for multimodal models.
_FORWARD_KEYS = (
    "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
    "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids",
)


class GRPOTrainer(ModelCardMixin, trl.GRPOTrainer):
    """Drop-in replacement for `trl.GRPOTrainer` that runs the variants selected in `trl_groupx.GRPOConfig`.

    Takes exactly TRL's arguments. A plain `trl.GRPOConfig` is accepted and trains as TRL does.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if getattr(self, "rollout_func", None) is None:  # a rollout_func's extra fields also reach reward functions
            columns = getattr(self.train_dataset, "column_names", None)
            check_reward_columns(self.reward_funcs, self.reward_func_names, columns)
        # rewards with a `bind(args)` method (trl_groupx.rewards) take their settings from this run's config
        self.reward_funcs = [f.bind(self.args) if callable(getattr(f, "bind", None)) else f for f in self.reward_funcs]
        self.reward_funcs = wrap_reward_funcs(self.reward_funcs, self.reward_func_names)
        check_model_for_flags(self)
        active = self.args.active_variants() if isinstance(self.args, GRPOConfig) else {}
        self.variants: dict[str, Variant] = {stage: get_variant(vid) for stage, vid in active.items()}
        self._generation_hooks = GenerationHooks(self.variants.get("sampling"))
        self._spo_tree = (getattr(self.variants.get("token_weights"), "id", None) == "spo_segment"
                          and self.args.spo_segment_mode == "tree")
        self._rewrites_rollouts = bool({"sampling", "advantages", "token_weights"} & self.variants.keys()) or getattr(
            self.args, "edge_grpo_gec", False)  # GEC re-scores rows: the advantages are recomputed from its rewards
        check_variant_components(self, self.variants)
        # A TRL loss type with a non-default KL term (estimator, asymmetric beta) runs through our reference of that
        # loss (same numbers otherwise).
        self._kl_estimator = getattr(self.args, "kl_estimator", "k3")
        self._reference_objective: Variant | None = None
        self._beta_negative = getattr(self.args, "beta_negative", None)  # MDP-GRPO: β where A < 0
        if (self._kl_estimator != "k3" or self._beta_negative is not None) and "objective" not in self.variants:
            self._reference_objective = get_variant(TRL_REFERENCE_SURROGATE[self.args.loss_type])
        if getattr(self.args, "rollout_filter", None) == "repo" and "objective" not in self.variants:  # RePO weights
            self._reference_objective = get_variant(TRL_REFERENCE_SURROGATE[self.args.loss_type])  # replayed rows
        # Rollout-level inputs of the objective, computed on the global batch where the rows still sit in groups.
        objective = self.variants.get("objective")
        self._objective_group_ids = bool(objective and "group_structure" in objective.requires)
        self._nll_anchor = bool(objective and "nll_anchor_weights" in objective.requires)  # lightningrl
        # importance_sampling_level="turn" (objective/turn_ratio.py): each completion token's turn, as a row tensor
        self._turn_ids = objective is not None and getattr(self.args, "importance_sampling_level", None) == "turn"
        self._teacher = None  # dGRPO: frozen teacher of the distillation term (objective/dgrpo.py)
        if objective is not None and "teacher_logps" in objective.requires:
            from .objective.dgrpo import load_teacher

            self._teacher = load_teacher(self)
        self._self_teacher = None  # SRPO: the self-teacher of the routed failed rollouts (objective/self_teacher.py)
        if objective is not None and "self_teacher_topk" in objective.requires:
            from .objective.self_teacher import SelfTeacher

            self._self_teacher = SelfTeacher(self)
        token_variant = self.variants.get("token_weights")
        self._dpo_model = None  # RTO: frozen DPO-trained model of the token rewards (token_weights/rto.py)
        if token_variant is not None and "dpo_logps" in token_variant.requires:
            from .token_weights.rto import load_dpo_model

            self._dpo_model = load_dpo_model(self)
        self._balanced_scope: str | None = None
        if objective is not None and resolved_aggregation(self.args) == "balanced":
            self._balanced_scope = self.args.balanced_agg_scope
        self._rewards_per_func: torch.Tensor | None = None
        adv_variant = self.variants.get("advantages")
        self._needs_steps = adv_variant is not None and "step_structure" in adv_variant.requires
        self._steps: StepBatch | None = None  # global per-step view of the current generation batch
        # ReMax / AAPO: the requirement naming the extra baseline completion (greedy or reference sample), if any
        self._baseline_requirement = next(
            (r for r in BASELINE_REQUIREMENTS if adv_variant is not None and r in adv_variant.requires), None)
        if self._baseline_requirement:
            check_baseline_rollouts(self, adv_variant.id, self._baseline_requirement)
        self._baseline_rewards: torch.Tensor | None = None
        self._generating_baseline = False  # set while those extra completions are generated
        self._explorer = None  # S2L-PO: frozen smaller model generating the explorer batches (sampling/s2l_po.py)
        if getattr(self.variants.get("sampling"), "id", None) == "s2l_po":
            from .sampling.s2l_po import load_explorer

            self._explorer = load_explorer(self)
        # CCPO: the reward of each episode's run without the credited agent (sampling/counterfactual_rewards.py)
        self._needs_counterfactual = adv_variant is not None and "counterfactual_rewards" in adv_variant.requires
        if self._needs_counterfactual:
            from .sampling.counterfactual_rewards import check_counterfactual_rollouts

            check_counterfactual_rollouts(self, adv_variant.id)
        self._counterfactual_rewards: torch.Tensor | None = None
        # Per stateful variant: the dict its function updates in place; saved with every checkpoint.
        self.variant_state: dict[str, dict[str, Any]] = {v.id: {} for v in self.variants.values() if v.stateful}
        if self._self_teacher is not None:  # SRPO: the EMA self-teacher's weights, saved too
            self._self_teacher.keep_state(self.variant_state)
        if adv_variant is not None and "prompt_kl" in adv_variant.requires:  # one stored response per prompt, saved too
            self.variant_state[f"{adv_variant.id}/prompt_kl"] = {}
        if getattr(self.args, "hapo_adaptive_temperature", False):  # HAPO: last batch's entropy statistics, saved too
            from .sampling.adaptive_temperature import STATE_KEY, check_generation_path

            check_generation_path(self)
            self.variant_state[STATE_KEY] = {}
        if getattr(self.variants.get("sampling"), "id", None) == "sage" and self.args.sage_method == "light":
            from .sampling.sage import LIGHT_STATE_KEY

            self.variant_state[LIGHT_STATE_KEY] = {}  # SAGE-light's per-prompt hint tracker, saved too
        self._sage_light_visit = None
        self._sppo_value = None  # SPPO: the value model V(x), trained with BCE per batch, saved in variant_state
        if adv_variant is not None and "prompt_value_logits" in adv_variant.requires:
            from .advantages.sppo_value import load_value_model

            self._sppo_value = load_value_model(self)

    # ---- rewards ------------------------------------------------------------------------------------------------

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        if getattr(self.variants.get("sampling"), "id", None) == "sage":  # SAGE: rewards see the prompt, no hint
            from .sampling.self_hints import reward_prompts

            prompts = reward_prompts(inputs, prompts)
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._rewards_per_func = rewards_per_func  # (N_global, K), gathered across processes by TRL
        return rewards_per_func

    # ---- sampling, advantages, token weights ----------------------------------------------------------------------

    def _generate_and_score_completions(self, inputs):
        training = self.model.training
        hooks = self._generation_hooks  # the sampling variant's own points around generation (generation_hooks.py)
        inputs = hooks.before(self, inputs, training)
        output = super()._generate_and_score_completions(inputs)
        inputs, output = hooks.after_generation(self, inputs, output, super()._generate_and_score_completions, training)
        if getattr(self.args, "edge_grpo_gec", False) and training:  # EDGE-GRPO GEC: correct wrong responses
            from .sampling.edge_grpo_gec import apply_gec

            output = apply_gec(self, inputs, output)
        if self._rewrites_rollouts:
            self._rollout_inputs = inputs  # the batch's rows (gcpo_guidance builds negative prompts from them)
            self._steps = self._collect_steps(inputs) if self._needs_steps else None
            if self._baseline_requirement:
                group_size = self.num_generations if self.model.training else self.num_generations_eval
                self._baseline_rewards = baseline_rewards(self, inputs, self._baseline_requirement, group_size)
            if self._needs_counterfactual:  # scored by the run's reward functions, like the rollouts
                from .sampling.counterfactual_rewards import counterfactual_rewards

                self._counterfactual_rewards = counterfactual_rewards(self, inputs, self.variants["advantages"].id)
            output = self.apply_rollout_stages(output)
        output = hooks.after_stages(self, inputs, output, training)
        if self._objective_group_ids or self._balanced_scope or self._nll_anchor:
            self._add_objective_rollout_inputs(output)
        if self._teacher is not None:  # the teacher's log-probs of the sampled tokens, shuffled and split with the rows
            from .objective.dgrpo import teacher_token_logps

            output["groupx_teacher_logps"] = teacher_token_logps(self, self._teacher, output, _FORWARD_KEYS)
        if self._self_teacher is not None:  # SRPO: routing and the self-teacher's top-k targets, split with the rows
            from .objective.self_teacher import self_teacher_targets

            output.update(self_teacher_targets(self, inputs, output))
        if self._turn_ids:  # per row (no other process's rows needed), shuffled and split with the rows by TRL
            from .objective.turn_ratio import completion_turn_ids

            output["groupx_turn_ids"] = completion_turn_ids(output)
        if getattr(self.args, "hapo_adaptive_temperature", False) and training:  # for the next batch
            from .sampling.adaptive_temperature import update_entropy_statistics

            update_entropy_statistics(self)
        return hooks.append_rows(self, inputs, output, training)  # last: every per-row tensor exists

    def _add_objective_rollout_inputs(self, output: dict[str, Any]) -> None:
        """Per-rollout tensors the objective needs but cannot compute from a shuffled micro-batch: the group id of
        each row (`group_structure`) and Balanced Aggregation's scale `c_i`. TRL shuffles and splits them with
        the rows they belong to."""
        group_size = self.num_generations if self.model.training else self.num_generations_eval
        local_n = output["completion_ids"].size(0)
        start = self.accelerator.process_index * local_n
        if self._objective_group_ids:
            rows = torch.arange(start, start + local_n, device=output["completion_ids"].device)
            output["groupx_group_ids"] = rows // group_size
        if self._balanced_scope:
            mask = output["completion_mask"]
            mask = mask if "tool_mask" not in output else mask * output["tool_mask"]
            advantages = output["advantages"]
            if advantages.dim() == 2:  # per-token advantages: the sign of the sequence's mean decides its class
                advantages = (advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1)
            scale = balanced_sequence_scale(
                self.accelerator.gather(advantages.float()), self.accelerator.gather(mask.sum(-1)), group_size,
                self._balanced_scope,
            )
            output["groupx_sequence_scale"] = scale[start : start + local_n]
        if self._nll_anchor:  # LightningRL: NLL weights of the correct rollouts, from global counts
            from .objective.lightningrl import nll_anchor_weights

            mask = output["completion_mask"]
            mask = mask if "tool_mask" not in output else mask * output["tool_mask"]
            rewards = (self._rewards_per_func * self.reward_weights.to(self._rewards_per_func.device)).nansum(dim=1)
            rewards[torch.isnan(self._rewards_per_func).all(dim=1)] = torch.nan
            weights = nll_anchor_weights(
                rewards, self.accelerator.gather(mask.sum(-1)), threshold=self.args.lightningrl_nll_threshold,
                reduction=self.args.lightningrl_nll_reduction, aggregation=resolved_aggregation(self.args),
                max_completion_length=self.max_completion_length,
            )
            output["groupx_anchor_weights"] = weights[start : start + local_n].to(mask.device)

    def _collect_steps(self, inputs: list[dict[str, Any]]) -> StepBatch:
        """Global `StepBatch` of the generation batch (episode ids are global row indices, in process order).

        Per local row: the rollout_func extra fields `step_states` / `step_rewards` (TRL merges a rollout_func's extra
        fields into each row's input dict before scoring), else `environment._step_structure()` of the row's
        environment (`environment_factory`; private so that TRL does not expose it as a tool). States are hashed
        here (`state_key`), so only integers and floats cross processes. An optional `step_final_state` field (the
        observation after the episode's last step, `graphgpo`'s last transition) fills `StepBatch.final_state`."""
        needs_modules = "step_modules" in self.variants["advantages"].requires  # mmgrpo: each step's module
        local = []
        for i, row in enumerate(inputs):
            final = row.get("step_final_state")
            modules = row.get("step_modules")
            if needs_modules and modules is None:
                raise ValueError(
                    f"advantage_estimator={self.args.advantage_estimator!r} groups LM calls by module: return a "
                    "`step_modules` list (the module name of each LM call, in call order) per episode from your "
                    "rollout_func (see trl_groupx/toy/two_module_program.py)."
                )
            if "step_states" in row:
                states = row["step_states"]
                rewards = row.get("step_rewards", [0.0] * len(states))
            elif modules is not None:  # a program's LM calls: no environment state to hash
                states, rewards = [0] * len(modules), row.get("step_rewards", [0.0] * len(modules))
            elif self.environments and hasattr(self.environments[i], "_step_structure"):
                states, rewards = self.environments[i]._step_structure()
            else:
                raise ValueError(
                    f"advantage_estimator={self.args.advantage_estimator!r} needs the step structure of each episode: "
                    "return `step_states` (and `step_rewards`) lists from your rollout_func, or give the environment "
                    "a `_step_structure()` method returning (states, rewards), one entry per model turn."
                )
            if len(rewards) != len(states):
                raise ValueError(f"Row {i}: {len(states)} step states but {len(rewards)} step rewards.")
            if modules is not None and len(modules) != len(states):
                raise ValueError(f"Row {i}: {len(states)} step states but {len(modules)} step modules.")
            local.append(([state_key(s) for s in states], [float(r) for r in rewards],
                          None if final is None else state_key(final),
                          None if modules is None else [state_key(m) for m in modules]))
        rows = gather_object(local) if self.accelerator.num_processes > 1 else local
        finals = [r[2] for r in rows]
        modules = [r[3] for r in rows] if all(r[3] is not None for r in rows) else None
        return StepBatch.from_lists([r[0] for r in rows], [r[1] for r in rows],
                                    None if all(f is None for f in finals) else finals, modules)

    def _global_loss_tokens(self, output: dict[str, Any]) -> torch.Tensor:
        """TRL's `num_items_in_batch`: the generation batch's loss tokens over all processes (completion mask times
        the tool mask of multi-turn rollouts), recounted after a stage masks rollouts out."""
        mask = output["completion_mask"]
        mask = mask if "tool_mask" not in output else mask * output["tool_mask"]
        return self.accelerator.gather(mask.sum()).sum()

    def apply_rollout_stages(self, output: dict[str, Any]) -> dict[str, Any]:
        """Run the sampling, advantage and token-weight stages on one generation batch; returns `output` updated.

        All statistics are computed on the global batch (`N = B_local × processes` rollouts, groups intact) so
        that every process computes the same numbers; each keeps its own slice.
        """
        mode = "train" if self.model.training else "eval"
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
        rewards_per_func = self._rewards_per_func
        local_n = output["completion_ids"].size(0)
        local = slice(self.accelerator.process_index * local_n, (self.accelerator.process_index + 1) * local_n)
        weights = self.reward_weights.to(rewards_per_func.device)
        rewards = (rewards_per_func * weights).nansum(dim=1)
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan

        layout = self._variable_group_layout(mode)
        keep = None
        if "sampling" in self.variants:
            lengths = self.accelerator.gather(output["completion_mask"].sum(-1))
            sizes = None if layout is None else layout.sizes
            keep = self._call(self.variants["sampling"], RolloutBatch(rewards, lengths, group_size, group_sizes=sizes))
            rewards, rewards_per_func = apply_keep_mask(rewards, keep), apply_keep_mask(rewards_per_func, keep)
            output["completion_mask"] = output["completion_mask"] * keep[local, None].to(output["completion_mask"])
            output["num_items_in_batch"] = self._global_loss_tokens(output)
            self._metrics[mode]["groupx/kept_fraction"].append(keep.float().mean().item())

        if layout is not None:  # groups of varying sizes (sampling/group_layout.py): GRPO's or GDPO's advantages
            advantages = self._variable_group_advantages(rewards, rewards_per_func, layout, mode)
        else:
            advantages = self.compute_advantages(rewards, rewards_per_func, group_size, output)
        if isinstance(advantages, tuple):  # an advantage variant that also leaves rollouts out (MC-GRPO's pivot)
            advantages, adv_keep = advantages
            output["completion_mask"] = output["completion_mask"] * adv_keep[local, None].to(output["completion_mask"])
            output["num_items_in_batch"] = self._global_loss_tokens(output)
            self._metrics[mode]["groupx/advantage_kept_fraction"].append(adv_keep.float().mean().item())
            keep = adv_keep if keep is None else keep & adv_keep
        if self._steps is not None:  # per-step advantages (S,) -> this process's (B, T) advantages on the turns
            steps = self._steps
            mine = (steps.episode >= local.start) & (steps.episode < local.stop)
            local_steps = StepBatch(steps.episode[mine] - local.start, steps.index[mine], steps.state[mine],
                                    steps.reward[mine])
            tool_mask = output.get("tool_mask", torch.ones_like(output["completion_mask"]))
            turns = turn_index_from_tool_mask(tool_mask, output["completion_mask"]).cpu()
            output["advantages"] = step_to_token_advantages(advantages.cpu()[mine], local_steps, turns).to(
                output["completion_mask"].device)
            counts = torch.bincount(steps.episode, minlength=rewards.numel()).clamp(min=1)
            seq_adv = torch.zeros(rewards.numel()).index_add_(0, steps.episode, advantages.float().cpu()) / counts
        elif "token_weights" in self.variants:
            ctx = self._token_context(output, rewards, group_size)
            token_adv = self._call(self.variants["token_weights"], advantages, ctx)
            output["advantages"] = token_adv[local, : output["completion_ids"].size(1)]
            seq_adv = (token_adv * ctx.completion_mask).sum(-1) / ctx.completion_mask.sum(-1).clamp(min=1)
            real = ctx.completion_mask.bool()  # tokens the variant masked out (zero credit), among real tokens
            self._metrics[mode]["groupx/token_zero_advantage_fraction"].append(
                ((token_adv == 0) & real).sum().item() / max(1, real.sum().item())
            )
        else:
            output["advantages"] = advantages[local]
            seq_adv = advantages
        if keep is not None:
            output["advantages"] = output["advantages"] * keep[local].view(-1, *[1] * (output["advantages"].dim() - 1))

        # TRL logged its own advantages for the completions table; show the ones that train instead.
        logged = self._logs["advantages"]
        for _ in range(min(len(seq_adv), len(logged))):
            logged.pop()
        logged.extend(seq_adv.tolist())
        self._metrics[mode]["groupx/advantage_abs_mean"].append(seq_adv.abs().mean().item())
        return output

    def _variable_group_layout(self, mode: str) -> Any:
        """The `GroupLayout` of the training batch being scored when a prompt selection sized its groups, else None."""
        sampler = getattr(self, "_prompt_sampler", None)
        return sampler.layout if mode == "train" and sampler is not None else None

    def _variable_group_advantages(self, rewards: torch.Tensor, rewards_per_func: torch.Tensor, layout: Any,
                                   mode: str) -> torch.Tensor:
        """Global `(N,)` advantages of a batch with variable group sizes: TRL's two formulas, or a group-local
        advantage estimator (the config-time checks allow no other); TRL's `frac_reward_zero_std`, taken on
        fixed-size groups, is replaced."""
        from .sampling.group_layout import (
            variable_group_decoupled_advantages,
            variable_group_normalized_advantages,
            zero_std_fraction,
        )

        sizes = layout.sizes
        zero_std = self._metrics[mode]["frac_reward_zero_std"]
        if zero_std:
            zero_std[-1] = zero_std_fraction(rewards.cpu(), sizes)
        self._metrics[mode]["groupx/groups_per_batch"].append(float(sizes.numel()))
        self._metrics[mode]["groupx/group_size_mean"].append(sizes.double().mean().item())
        variant = self.variants.get("advantages")
        if variant is not None:  # a group-local estimator (config-time checked): group by group, each its own G
            from .sampling.group_layout import per_group_advantages

            result = per_group_advantages(lambda group, size: self._call(variant, group, size), rewards.cpu(), sizes)
            advantages, keep = result if isinstance(result, tuple) else (result, None)
            if not torch.isfinite(advantages).all():
                raise ValueError(f"advantage_estimator={variant.id!r} returned non-finite advantages.")
            advantages = advantages.to(rewards.device)
            return advantages if keep is None else (advantages, keep.to(rewards.device))
        if self.multi_objective_aggregation == "normalize_then_sum":
            return variable_group_decoupled_advantages(rewards_per_func.cpu(), sizes,
                                                       reward_weights=self.reward_weights.cpu()).to(rewards.device)
        return variable_group_normalized_advantages(rewards.cpu(), sizes, scale_rewards=self.scale_rewards).to(
            rewards.device)

    def compute_advantages(
        self, rewards: torch.Tensor, rewards_per_func: torch.Tensor, group_size: int, output: dict[str, Any]
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Global `(N,)` advantages: the selected advantage variant, else TRL's own numbers. A variant may also return
        a `(N,)` bool keep mask (`(advantages, keep)`): the rollouts it leaves out get no loss tokens."""
        variant = self.variants.get("advantages")
        if variant is not None:
            source = rewards_per_func if "rewards_per_func" in variant.requires else rewards
            extra = {}
            if "completion_lengths" in variant.requires:
                extra["completion_lengths"] = self.accelerator.gather(output["completion_mask"].sum(-1)).float()
            if "prompt_keys" in variant.requires:  # stable per-prompt hash (global order) for per-prompt state
                from .advantages._prompt_keys import prompt_keys_from_ids

                extra["prompt_keys"] = prompt_keys_from_ids(
                    self._gather_padded(output["prompt_ids"]), self._gather_padded(output["prompt_mask"]))
            if "prompt_kl" in variant.requires:  # policy drift on each prompt's last stored response (SPO's rho)
                prompt_kl = self._prompt_kl(variant, output, extra.get("prompt_keys"), rewards)
                if prompt_kl is not None:
                    extra["prompt_kl"] = prompt_kl
            if self._baseline_requirement:  # ReMax / AAPO: rewards of the extra baseline completions
                extra[self._baseline_requirement] = self._baseline_rewards
            if "counterfactual_rewards" in variant.requires:  # CCPO: rewards of the runs without the credited agent
                extra["counterfactual_rewards"] = self._counterfactual_rewards
            if "judge_scores" in variant.requires:  # SGPO: a judge re-scores the all-negative groups only
                from .advantages.allneg_aifeedback import judge_scores_for_batch

                extra["judge_scores"] = judge_scores_for_batch(self, output, rewards, group_size)
            if "pair_similarity" in variant.requires:  # DaGRPO: a scorer's similarity of each pair in a group
                from .advantages.dagrpo import pair_similarity_for_batch

                extra["pair_similarity"] = pair_similarity_for_batch(self, output, rewards, group_size)
            if "prompt_value_logits" in variant.requires:  # SPPO: V(x) before the value model's update on this batch
                from .advantages.sppo_value import prompt_value_logits

                extra["prompt_value_logits"] = prompt_value_logits(self, output, rewards)
            if "step_structure" in variant.requires:  # step records live on the CPU (built from Python lists)
                extra["steps"] = self._steps
                source = source.cpu()
            result = self._call(variant, source, group_size, **extra)
            advantages = result[0] if isinstance(result, tuple) else result
            if not torch.isfinite(advantages).all():
                raise ValueError(f"advantage_estimator={variant.id!r} returned non-finite advantages.")
            return result
        if "sampling" in self.variants or getattr(self.args, "edge_grpo_gec", False):  # rewards changed (dropped
            # rollouts, GEC's re-scored rows): recompute TRL's formula
            if self.multi_objective_aggregation == "normalize_then_sum":
                return decoupled_normalized_advantages(rewards_per_func, group_size, reward_weights=self.reward_weights)
            return group_normalized_advantages(rewards, group_size, scale_rewards=self.scale_rewards)
        return self.accelerator.gather(output["advantages"])  # TRL's, unchanged

    def _prompt_kl(self, variant: Variant, output: dict[str, Any], keys: torch.Tensor | None,
                   rewards: torch.Tensor) -> torch.Tensor | None:
        """`(N,)` requirement `prompt_kl` (`advantages/prompt_kl.py`): None when the variant's `*_rho_mode` is not
        "kl"; NaN in evaluation (the stored responses advance in training only); else D per row, and the store of
        last responses updated with this batch."""
        from .advantages._prompt_keys import prompt_keys_from_ids
        from .advantages.prompt_kl import compute_prompt_kl, prompt_kl_enabled

        if not prompt_kl_enabled(variant, self.args):
            return None
        if not self.model.training:
            return torch.full((rewards.numel(),), float("nan"), dtype=torch.float64)
        if keys is None:
            keys = prompt_keys_from_ids(self._gather_padded(output["prompt_ids"]),
                                        self._gather_padded(output["prompt_mask"]))
        d = compute_prompt_kl(self, output, keys, rewards, self.variant_state[f"{variant.id}/prompt_kl"])
        seen = ~torch.isnan(d)  # as the official spo/D and spo/first_sampled_ratio
        self._metrics["train"]["groupx/prompt_kl_new_fraction"].append(1.0 - seen.float().mean().item())
        if seen.any():
            self._metrics["train"]["groupx/prompt_kl_mean"].append(d[seen].mean().item())
        return d

    def _token_context(self, output: dict[str, Any], rewards: torch.Tensor, group_size: int) -> TokenContext:
        """Global `(N, T_max)` per-token inputs for the token-weight stage (padded across processes)."""
        requires = self.variants["token_weights"].requires
        logps = entropies = sum_pi_squared = None
        tempered = None
        if "sum_pi_squared" in requires:  # needs the full logits: one forward gives all three
            logps, entropies, sum_pi_squared = self._rollout_logps(
                output, self.model, compute_entropy=True, compute_sum_pi_squared=True)
        elif "tempered_logps" in requires:  # full logits too: log-probs at TRL's and the variant's temperatures
            logps, entropies, tempered = self._tempered_logps(output)
        elif "entropies" in requires or "old_logps" in requires:
            logps, entropies = self._rollout_logps(output, self.model, compute_entropy=True)
        ref = output.get("ref_per_token_logps")
        if ref is None and "ref_logps" in requires:  # beta = 0 with LoRA: the base model is the reference
            model = self.accelerator.unwrap_model(self.model)
            with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
                ref, _ = self._rollout_logps(output, self.model, compute_entropy=False)
        completion_mask = self._gather_padded(output["completion_mask"])
        completion_ids = self._gather_padded(output["completion_ids"])
        rewards_per_func = token_blocks = None
        if "rewards_per_func" in requires:  # NaN where `rewards` is: unscored, or dropped by the sampling stage
            rewards_per_func = self._rewards_per_func.clone()
            rewards_per_func[torch.isnan(rewards)] = torch.nan
        if "token_blocks" in requires:  # each token's text block, from the tags of the variant's *_block_tags field
            from .token_weights.blocks import block_tags_field, token_block_ids

            tags = getattr(self.args, block_tags_field(self.variants["token_weights"].params))
            token_blocks = token_block_ids(completion_ids, completion_mask, self.processing_class, tags)
        contrast = self._contrast_logps(output) if "contrast_logps" in requires else None
        dpo = None
        if "dpo_logps" in requires:  # RTO: the DPO model's log-probs of the sampled tokens (token_weights/rto.py)
            from .token_weights.rto import dpo_token_logps

            dpo = dpo_token_logps(self, self._dpo_model, output, _FORWARD_KEYS)
        belief_segments = belief_logps = None
        if "answer_belief" in requires:  # GRPO-VPS: segments and answer log-probs at their boundaries (belief_probe)
            from .token_weights.belief_probe_forward import answer_belief

            belief_segments, belief_logps = answer_belief(self, output, entropies)
        segment_values = segment_multiplicity = None
        if "segment_mc_values" in requires:  # SPO-chain: MC values at the low-probability cut points (spo_segment)
            if self._spo_tree:  # the grown tree's node values at its segment boundaries
                from .token_weights.spo_tree_rollouts import tree_values

                segment_values, segment_multiplicity = tree_values(self, output)
            else:
                from .token_weights.spo_segment_rollouts import segment_mc_values

                segment_values = segment_mc_values(self, output, logps)
        prm_step_ids = prm_step_scores = None
        if "prm_step_scores" in requires:  # VeriGate step credit: the step PRM on the degenerate groups only
            from .token_weights.verigate_step import prm_steps_for_batch

            prm_step_ids, prm_step_scores = prm_steps_for_batch(self, output, rewards, group_size)
        divergence = None
        if "intra_group_token_divergence" in requires:  # TW-GRPO: full next-token distributions, group by group
            divergence = self._intra_group_token_divergence(output, group_size)
        return TokenContext(
            completion_mask=completion_mask,
            group_size=group_size,
            entropies=self._gather_padded(entropies),
            logps=self._gather_padded(logps),
            ref_logps=self._gather_padded(ref),
            completion_ids=completion_ids,
            rewards=rewards,
            sum_pi_squared=self._gather_padded(sum_pi_squared),
            rewards_per_func=rewards_per_func,
            token_blocks=token_blocks,
            contrast_logps=self._gather_padded(contrast),
            intra_group_token_divergence=divergence,
            tempered_logps=self._gather_padded(tempered),
            dpo_logps=self._gather_padded(dpo),
            belief_segment_ids=belief_segments,
            answer_belief_logps=belief_logps,
            segment_mc_values=segment_values,
            segment_multiplicity=segment_multiplicity,
            prm_step_ids=prm_step_ids,
            prm_step_scores=prm_step_scores,
        )

    def _contrast_logps(self, output: dict[str, Any]) -> torch.Tensor:
        """This process's `(B, T)` no-grad log-probs of its completions under the negative version of each row's
        prompt (`token_weights/gcpo_guidance.py`)."""
        from .token_weights.gcpo_guidance import negative_prompt_logps

        return negative_prompt_logps(self, output, [row["prompt"] for row in self._rollout_inputs])

    def _tempered_logps(self, output: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This process's no-grad `(logps, entropies)` at TRL's temperature and `(B, T, M)` log-probs at the
        temperatures of the token variant's `*_temperatures` field, from one forward
        (`token_weights/tempered_logps.py`)."""
        from .token_weights.tempered_logps import logp_temperatures_field, per_token_logps_at_temperatures

        temperatures = getattr(self.args, logp_temperatures_field(self.variants["token_weights"].params))
        return per_token_logps_at_temperatures(
            self.model, torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1),
            torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1), output["completion_ids"].size(1),
            temperature=self.temperature, temperatures=list(temperatures),
            batch_size=self.args.per_device_train_batch_size, autocast=self.accelerator.autocast,
            **{k: output[k] for k in _FORWARD_KEYS if k in output},
        )

    def _intra_group_token_divergence(self, output: dict[str, Any], group_size: int) -> torch.Tensor:
        """Global `(N, T_max)` requirement `intra_group_token_divergence` (`token_weights/tw_grpo.py`). Groups may
        straddle processes, so every process gathers the global batch's token ids, runs the no-grad forward for
        the groups `g ≡ rank (mod processes)` only (the same number of forwards everywhere, for sharded models),
        and a sum across processes fills in the others."""
        from .token_weights.tw_grpo import intra_group_token_divergence

        acc = self.accelerator
        prompt_ids = acc.gather(acc.pad_across_processes(output["prompt_ids"], dim=1, pad_index=0, pad_first=True))
        prompt_mask = acc.gather(acc.pad_across_processes(output["prompt_mask"], dim=1, pad_index=0, pad_first=True))
        completion_ids = self._gather_padded(output["completion_ids"])
        completion_mask = self._gather_padded(output["completion_mask"])
        n_groups = completion_ids.size(0) // group_size
        divergence = intra_group_token_divergence(
            self.model, prompt_ids, prompt_mask, completion_ids, completion_mask, group_size,
            temperature=self.temperature, groups=range(acc.process_index, n_groups, acc.num_processes),
            min_forwards=-(-n_groups // acc.num_processes),
            autocast=acc.autocast, **{k: output[k] for k in _FORWARD_KEYS if k in output},
        )
        return acc.reduce(divergence, reduction="sum") if acc.num_processes > 1 else divergence

    def _rollout_logps(
        self, output: dict[str, Any], model, compute_entropy: bool, compute_sum_pi_squared: bool = False
    ):
        """No-grad per-token log-probs (and entropies) of the generated completions under `model`. With
        `compute_sum_pi_squared`, returns `(logps, entropies, Σ_v π_v²)` from the model's full logits instead
        (`token_weights/sum_pi_squared.py`; TRL's fused LM head returns no Σπ²)."""
        input_ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attention_mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        if compute_sum_pi_squared:
            from .token_weights.sum_pi_squared import per_token_logps_entropies_sum_pi_squared

            return per_token_logps_entropies_sum_pi_squared(
                model, input_ids, attention_mask, output["completion_ids"].size(1), temperature=self.temperature,
                batch_size=self.args.per_device_train_batch_size, autocast=self.accelerator.autocast,
                **{k: output[k] for k in _FORWARD_KEYS if k in output},
            )
        with torch.no_grad():
            logps, entropies, _ = self._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, output["completion_ids"].size(1),
                batch_size=self.args.per_device_train_batch_size, compute_entropy=compute_entropy,
                **{k: output[k] for k in _FORWARD_KEYS if k in output},
            )
        return logps, entropies

    def _gather_padded(self, x: torch.Tensor | None) -> torch.Tensor | None:
        if x is None:
            return None
        return self.accelerator.gather(self.accelerator.pad_across_processes(x, dim=1, pad_index=0))

    def _call(self, variant: Variant, *args: Any, **extra: Any) -> Any:
        kwargs = {**config_kwargs(variant.fn, self.args), **extra}
        if "global_step" in variant.requires:  # for schedules: optimizer steps done and planned
            kwargs.update(global_step=self.state.global_step, total_steps=self.state.max_steps)
        if variant.stateful:
            state = self.variant_state[variant.id]
            # Evaluation must not advance running baselines or priors: it works on a throw-away copy.
            kwargs["state"] = state if self.model.training else copy.deepcopy(state)
        return variant.fn(*args, **kwargs)

    # ---- prompt selection (sampling/prompt_sampler.py) ---------------------------------------------------------

    def _get_train_sampler(self, dataset=None):
        from .sampling.prompt_sampler import build_train_sampler

        return build_train_sampler(self, dataset, super()._get_train_sampler)

    def _prepare_inputs(self, generation_batch):
        from .sampling.prompt_sampler import resolve_generation_batch

        return super()._prepare_inputs(resolve_generation_batch(self, generation_batch))

    # ---- checkpoints ---------------------------------------------------------------------------------------------

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.variant_state and self.args.should_save:
            folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
            torch.save(self.variant_state, os.path.join(folder, VARIANT_STATE_NAME))

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        path = os.path.join(checkpoint, VARIANT_STATE_NAME) if checkpoint is not None else None
        if self.variant_state and path is not None:
            if not os.path.exists(path):
                raise FileNotFoundError(
                    f"{checkpoint} has no {VARIANT_STATE_NAME}: it was not saved by a run with the stateful variants "
                    f"{sorted(self.variant_state)}; resume from a checkpoint of the same configuration."
                )
            saved = torch.load(path, weights_only=True)
            for vid in self.variant_state:
                self.variant_state[vid].clear()
                self.variant_state[vid].update(saved.get(vid, {}))

    # ---- log-probs ----------------------------------------------------------------------------------------------

    def _get_per_token_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False,
        compute_aux_loss=False, **multimodal,
    ):
        """TRL's method, unless `logps_chunk_size` is set: then the LM head runs on `logps_chunk_size` completion
        tokens at a time under activation checkpointing (`trl_groupx/memory/chunked_logps.py`), same outputs."""
        if getattr(self.variants.get("sampling"), "id", None) == "logit_avg":  # log-probs of the mixed policy
            from .sampling.logit_averaging import mixed_logps_and_entropies

            return mixed_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                             batch_size=batch_size, compute_entropy=compute_entropy,
                                             compute_aux_loss=compute_aux_loss, **multimodal)
        n_grpo = getattr(self.variants.get("sampling"), "id", None) == "n_grpo"
        if n_grpo and not getattr(self, "_n_grpo_replaying", False):  # N-GRPO: the rollout's mixed inputs, replayed
            from .sampling.neighbor_mixing import replayed_logps

            return replayed_logps(self, model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                                  compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **multimodal)
        if getattr(self.args, "prefix_grouper", False):  # shared-prefix forward (memory/prefix_grouper.py)
            from .memory.prefix_grouper import prefix_grouped_logps_and_entropies

            return prefix_grouped_logps_and_entropies(
                self, model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **multimodal,
            )
        if getattr(self.args, "logps_chunk_size", None) is None:
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **multimodal,
            )
        from .memory.chunked_logps import chunked_per_token_logps_and_entropies

        return chunked_per_token_logps_and_entropies(
            self, model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
            compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **multimodal,
        )

    # ---- generation ---------------------------------------------------------------------------------------------

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        """`_generate_rows`, wrapped for a training batch's own generation by the sampling variant's `generate` hook
        (`sampling/generation_hooks.py`: SOUP's prefixes, Pilot-Commit's stored pilot rollouts) and by SPO-tree's
        growth (`token_weights/spo_tree_rollouts.py`)."""
        own_batch = self.model.training and not self._generating_baseline
        generate = self._generation_hooks.generate(self, self._generate_rows, own_batch)
        if self._spo_tree and own_batch:  # SPO-tree: each group grown as the leaf paths of one tree
            from .token_weights.spo_tree_rollouts import generate_tree

            generate = functools.partial(generate_tree, self, generate)
        return generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)

    def _generate_rows(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        """TRL's method, run on chunks of at most `generation_micro_group_size` rows when that is set
        (`sampling/micro_groups.py`), and once per temperature of `generation_temperatures` when those apply to this
        batch's group size (`sampling/temperatures.py`; not for the extra baseline completions of remax/aapo); with
        `hapo_adaptive_temperature`, training generations sample each token at an entropy-adaptive temperature
        (`sampling/adaptive_temperature.py`)."""
        generate = super()._generate_single_turn
        if getattr(self.variants.get("sampling"), "id", None) == "n_grpo" and self.model.training and not \
                self._generating_baseline:  # N-GRPO: semantic neighbour mixing (sampling/neighbor_mixing.py)
            from .sampling.neighbor_mixing import generate_with_neighbor_mixing

            generate = functools.partial(generate_with_neighbor_mixing, self, generate)
        if getattr(self.variants.get("sampling"), "id", None) == "logit_avg":  # sample from the mixed policy
            from .sampling.logit_averaging import generate_with_logit_averaging

            generate = functools.partial(generate_with_logit_averaging, self, generate)
        if self._explorer is not None and self.model.training and not self._generating_baseline:
            from .sampling.s2l_po import generate_on_explorer_steps  # S2L-PO: the explorer generates on its batches

            generate = functools.partial(generate_on_explorer_steps, self, generate)
        adaptive = getattr(self.args, "hapo_adaptive_temperature", False) and not self._generating_baseline
        if adaptive and self.model.training:  # HAPO: per-token temperature (innermost: one processor per generate)
            from .sampling.adaptive_temperature import generate_with_adaptive_temperature

            generate = functools.partial(generate_with_adaptive_temperature, self, generate)
        if getattr(self.args, "generation_micro_group_size", None) is not None:
            from .sampling.micro_groups import generate_in_micro_groups

            generate = functools.partial(generate_in_micro_groups, self, generate)
        temperatures = getattr(self.args, "generation_temperatures", None)
        group_size = self.num_generations if self.model.training else self.num_generations_eval
        if temperatures is not None and len(temperatures) == group_size and not self._generating_baseline:
            from .sampling.temperatures import generate_at_temperatures

            return generate_at_temperatures(self, generate, prompt_ids, images, multimodal_fields, num_generations,
                                            has_tool_images)
        return generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)

    # ---- objective ----------------------------------------------------------------------------------------------

    def _compute_loss(self, model, inputs):
        if getattr(self.variants.get("sampling"), "id", None) == "n_grpo":  # N-GRPO: this micro-batch's mixed inputs
            from .sampling.neighbor_mixing import set_loss_replay

            set_loss_replay(self, inputs)
        objective = self.variants.get("objective") or self._reference_objective
        if objective is None:
            return super()._compute_loss(model, inputs)
        return self.compute_objective_loss(model, inputs, objective)

    def compute_objective_loss(self, model, inputs: dict[str, Any], objective: Variant) -> torch.Tensor:
        """Loss of a trl_groupx objective: its per-token surrogate, then TRL's masks and KL, then the aggregation.

        Keeps what TRL applies around every surrogate: tool mask, top-entropy mask, off-policy mask, vLLM
        importance-sampling correction, KL to the reference (`kl_estimator`, k3 by default, with optional bias
        correction), MoE aux loss and gradient-accumulation scaling. TRL's entropy bonus is rejected at config time
        for these objectives.
        """
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], completion_mask], dim=1)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        self_distill = None
        if "groupx_srpo_routed" in inputs and inputs["groupx_srpo_routed"].any():  # SRPO: + the teacher's top-k ids
            from .objective.self_teacher import SelfDistillBatch, student_forward

            logps, entropies, aux_loss, student_topk = student_forward(
                self, model, inputs, input_ids, attention_mask, inputs["groupx_srpo_topk_ids"], self.aux_loss_enabled)
            self_distill = SelfDistillBatch(inputs["groupx_srpo_routed"], inputs["groupx_srpo_weights"],
                                            inputs["groupx_srpo_teacher_topk_logps"], student_topk)
        else:
            logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True,
                compute_aux_loss=self.aux_loss_enabled, **{k: inputs.get(k) for k in _FORWARD_KEYS},
            )
        old_logps = inputs.get("old_per_token_logps")
        old_logps = logps.detach() if old_logps is None else old_logps
        advantages = inputs["advantages"]
        advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages

        ctx = ObjectiveContext(logps, old_logps, advantages, mask, entropies.detach(), inputs.get("groupx_group_ids"),
                               teacher_logps=inputs.get("groupx_teacher_logps"),
                               anchor_weights=inputs.get("groupx_anchor_weights"),
                               turn_ids=inputs.get("groupx_turn_ids"), self_distill=self_distill)
        per_token_loss = self._call(objective, ctx)
        mode = "train" if self.model.training else "eval"
        if ctx.teacher_logps is not None:  # dGRPO: per-token sampled reverse KL to the teacher (objective/dgrpo.py)
            from .objective.dgrpo import sampled_reverse_kl

            self._metrics[mode]["groupx/teacher_reverse_kl"].append(
                self._global_masked_mean(sampled_reverse_kl(logps.detach(), ctx.teacher_logps, mask), mask))
        if logps.requires_grad:  # diagnostic: tokens the surrogate passes no gradient to (clipped, capped, masked)
            self._metrics[mode]["groupx/zero_gradient_token_fraction"].append(
                self._zero_gradient_fraction(per_token_loss, logps, advantages, mask)
            )
        if self.off_policy_mask_threshold is not None:
            per_token_loss = per_token_loss * self.get_off_policy_mask(
                advantages=advantages, per_token_logps=logps,
                sampling_per_token_logps=inputs.get("sampling_per_token_logps", old_logps), mask=mask,
                off_policy_threshold=self.off_policy_mask_threshold,
            )
        if self.top_entropy_quantile < 1.0:
            per_token_loss = per_token_loss * self.get_high_entropy_mask(entropies, mask, 1 - self.top_entropy_quantile)
        if self.use_vllm and self.vllm_importance_sampling_correction:
            per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]
        if self.beta != 0.0:
            per_token_kl = per_token_kl_fn(logps, inputs["ref_per_token_logps"], self._kl_estimator)
            if self.args.use_bias_correction_kl:  # importance-weight the estimate, at TRL's ratio level
                per_token_kl = per_token_kl * torch.exp(log_ratio(ctx, self.args.importance_sampling_level))
            per_token_loss = per_token_loss + kl_coefficient(self.beta, self._beta_negative, advantages) * per_token_kl
            self._metrics[mode]["kl"].append(self._global_masked_mean(per_token_kl, mask))

        if "groupx_replay" in inputs:  # RePO: L_on + repo_off_coef * L_off (sampling/repo.py)
            from .sampling.repo import replay_token_weights

            per_token_loss = per_token_loss * replay_token_weights(
                inputs["groupx_replay"], mask, resolved_aggregation(self.args), self.args.repo_off_coef)
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        aggregation = resolved_aggregation(self.args)
        if aggregation == "global_token_mean":
            tokens = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
            if mode == "train":
                tokens = tokens * accumulation / self.args.steps_per_generation
            loss = aggregate(per_token_loss, mask, aggregation, global_num_tokens=tokens)
        else:
            loss = aggregate(per_token_loss, mask, aggregation, max_completion_length=self.max_completion_length,
                             sequence_scale=inputs.get("groupx_sequence_scale"))
            loss = loss / accumulation
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * aux_loss / accumulation
        self._metrics[mode]["entropy"].append(self._global_masked_mean(entropies, mask))
        return loss

    def _zero_gradient_fraction(self, per_token_loss, logps, advantages, mask) -> float:
        """Share of the loss tokens with a non-zero advantage whose surrogate gradient w.r.t. their log-prob is 0
        (the generic "clip fraction" of any objective). Differentiates the surrogate only, not the model."""
        (grad,) = torch.autograd.grad((per_token_loss * mask).sum(), logps, retain_graph=True, allow_unused=True)
        active = (mask > 0) & (advantages.expand_as(mask) != 0)
        zero = active & ((grad == 0) if grad is not None else torch.ones_like(active))
        return self._global_masked_mean(zero.float(), active.float())

    def _global_masked_mean(self, x: torch.Tensor, mask: torch.Tensor) -> float:
        totals = self.accelerator.reduce(torch.stack([(x * mask).sum(), mask.sum().float()]), reduction="sum")
        return (totals[0] / totals[1].clamp(min=1.0)).item()
