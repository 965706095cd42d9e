"""`trl-groupx grpo --config recipe.yaml`: TRL's GRPO script with trl_groupx's config, in TRL's argument style.

A recipe is a flat YAML of `GRPOScriptArguments`, `trl.ModelConfig` and `trl_groupx.GRPOConfig` fields, exactly
like TRL's own `trl grpo --config`; any field can be overridden on the command line (`--loss_type gmpo`).

Loading a recipe never executes code: YAML is parsed safely, and `reward_funcs` resolve by registered name
(`REWARD_FUNCS`) unless `--allow_reward_imports` is given, which allows dotted import paths.
The shipped tiny model and toy dataset are reachable by name (`TOY_MODEL`, `TOY_DATASET`), so any recipe can be
tried on CPU in seconds: `trl-groupx grpo --config recipes/gmpo.yaml --toy --max_steps 2`.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

TOY_MODEL = "trl_groupx/tiny-arith"
TOY_DATASET = "trl_groupx/toy-arithmetic"


def _reward_funcs() -> dict[str, Callable[..., Any]]:
    from trl.rewards import accuracy_reward, reasoning_accuracy_reward, think_format_reward

    from .toy import arithmetic_reward
    from .toy.counter_rollout import counter_outcome_reward
    from .toy.two_agent_rollout import two_agent_answer_reward
    from .toy.two_module_program import program_score_reward

    return {
        "accuracy_reward": accuracy_reward,
        "counter_game_outcome": counter_outcome_reward,
        "two_agent_answer": two_agent_answer_reward,
        "two_module_program_score": program_score_reward,
        "reasoning_accuracy_reward": reasoning_accuracy_reward,
        "think_format_reward": think_format_reward,
        "arithmetic_reward": arithmetic_reward,
        **_groupx_rewards(),
    }


def _groupx_rewards() -> dict[str, Callable[..., Any]]:
    from .rewards import REWARD_FUNCS  # math-verify, format, DAPO overlong and the application papers' rewards

    return dict(REWARD_FUNCS)


def _bind_rewards(rewards: list[Callable[..., Any]], training_args) -> list[Callable[..., Any]]:
    from .rewards import bind_training_args  # rewards with bind(args) take e.g. max_completion_length from the config

    return bind_training_args(rewards, training_args)


def _script_arguments_cls():
    from trl import ScriptArguments

    @dataclass
    class GRPOScriptArguments(ScriptArguments):
        """Script arguments of `trl-groupx grpo` (TRL's, plus the recipe's reward functions and the toy switch)."""

        reward_funcs: list[str] = field(
            default_factory=list, metadata={"help": "Reward functions by registered name (see REWARD_FUNCS)."}
        )
        allow_reward_imports: bool = field(
            default=False, metadata={"help": "Also accept dotted import paths in reward_funcs (runs their code)."}
        )
        toy: bool = field(
            default=False,
            metadata={"help": "Swap model, dataset and rewards for the shipped tiny arithmetic setup (CPU check)."},
        )
        rollout: str | None = field(
            default=None, metadata={"help": "Multi-turn rollout by registered name (see ROLLOUTS), e.g. counter_game."}
        )
        num_rounds: int | None = field(
            default=None, metadata={"help": "rollout=multi_round (MOTIF): thinking rounds per rollout (default 3)."}
        )
        multi_round_futures: int | None = field(
            default=None, metadata={"help": "rollout=multi_round: later-round trajectories per rollout (default 4)."}
        )
        multi_round_future_model: str | None = field(
            default=None, metadata={"help": "rollout=multi_round: 'policy' (default) or 'base' samples rounds 2..k."}
        )
        multi_round_max_tokens: int | None = field(
            default=None, metadata={"help": "rollout=multi_round: new tokens per later round (max_completion_length)."}
        )
        headroom_probe_prompts: int = field(
            default=0, metadata={"help": "Before training, log sampled-minus-greedy success (headroom/*) of the first "
                                         "N training prompts under the first reward (webagent_headroom); 0 = off."}
        )
        headroom_probe_samples: int = field(
            default=8, metadata={"help": "headroom_probe_prompts: sampled completions per prompt."}
        )
        plan: bool = field(
            default=False, metadata={"help": "Print the memory plan (docs/memory.md) and exit without training."}
        )
        plan_prompt_length: int | None = field(
            default=None, metadata={"help": "Prompt length for --plan (default: vllm_max_model_length - "
                                            "max_completion_length, else 512)."}
        )
        plan_gpu_gb: float = field(default=40.0, metadata={"help": "GPU size in GiB for --plan."})

    return GRPOScriptArguments


def _rollouts() -> dict[str, Callable[[], Any]]:
    """Named multi-turn rollouts (TRL `rollout_func` factories) a recipe can select with `rollout:`."""
    from .rollouts import make_multi_round_rollout
    from .toy.counter_rollout import make_counter_game_rollout
    from .toy.two_agent_rollout import make_two_agent_rollout
    from .toy.two_module_program import make_two_module_program_rollout

    return {"counter_game": make_counter_game_rollout, "multi_round": make_multi_round_rollout,
            "two_module_program": make_two_module_program_rollout,
            "two_agent": make_two_agent_rollout}


_MULTI_ROUND_ARGS = {"num_rounds": "num_rounds", "multi_round_futures": "num_futures",
                     "multi_round_future_model": "future_model", "multi_round_max_tokens": "max_round_tokens"}


def _rollout_kwargs(script_args, training_args) -> dict[str, Any]:
    """Factory arguments of the recipe's rollout (only multi_round takes any); refuses them for other rollouts."""
    given = {k: getattr(script_args, k) for k in _MULTI_ROUND_ARGS if getattr(script_args, k) is not None}
    if script_args.rollout != "multi_round":
        if given:
            raise ValueError(f"{sorted(given)}: only for rollout: multi_round (got rollout={script_args.rollout!r}).")
        return {}
    if training_args.use_vllm:
        raise ValueError("rollout: multi_round generates every round with transformers on the trainer's model; "
                         "set use_vllm: false.")
    return {_MULTI_ROUND_ARGS[k]: v for k, v in given.items()}


def resolve_reward_funcs(names: list[str], allow_imports: bool) -> list[Callable[..., Any]]:
    """Reward callables for `names`; a clear error for unknown names or imports that were not allowed."""
    registry = _reward_funcs()
    funcs = []
    for name in names:
        if name in registry:
            funcs.append(registry[name])
        elif "." in name and allow_imports:
            module, attr = name.rsplit(".", 1)
            funcs.append(getattr(importlib.import_module(module), attr))
        else:
            hint = " Pass --allow_reward_imports to import it." if "." in name else ""
            raise ValueError(f"reward_funcs: unknown reward {name!r}; registered: {sorted(registry)}.{hint}")
    if not funcs:
        raise ValueError("reward_funcs is empty: name at least one reward function in the recipe.")
    return funcs


def make_parser():
    from trl import ModelConfig, TrlParser

    from .config import GRPOConfig

    return TrlParser((_script_arguments_cls(), GRPOConfig, ModelConfig), prog="trl-groupx grpo")


def build_trainer(script_args, training_args, model_args):
    """The `GRPOTrainer` a recipe describes (model, dataset, rewards, LoRA/QLoRA settings)."""
    from datasets import load_dataset
    from trl import get_peft_config, get_quantization_config

    from .toy import arithmetic_dataset, arithmetic_reward, load_tiny_tokenizer, tiny_model_path
    from .trainer import GRPOTrainer

    processing_class = None
    if script_args.toy or model_args.model_name_or_path == TOY_MODEL:
        model_args.model_name_or_path = tiny_model_path()
        processing_class = load_tiny_tokenizer()
    if processing_class is not None and training_args.rollout_filter == "rc_grpo":
        # RC-GRPO refuses a tokenizer without its reward tokens: the toy gets them added (untrained, not an RCTP)
        from .sampling.rctp import save_with_condition_tokens

        model_args.model_name_or_path = save_with_condition_tokens(
            model_args.model_name_or_path, processing_class,
            f"{training_args.output_dir}/toy-with-condition-tokens/rank{training_args.process_index}",
            training_args.rc_grpo_prompt_condition_tokens)
    teacher = getattr(training_args, "opd_teacher_model", None)  # dGRPO's teacher shares the student's tokenizer
    if teacher is not None and (script_args.toy or teacher == TOY_MODEL):
        training_args.opd_teacher_model = tiny_model_path()
    dpo_model = getattr(training_args, "rto_dpo_model", None)  # RTO's DPO model shares the policy's tokenizer
    if dpo_model is not None and (script_args.toy or dpo_model == TOY_MODEL):
        training_args.rto_dpo_model = tiny_model_path()
    explorer = getattr(training_args, "s2l_po_explorer_model", None)  # S2L-PO's explorer shares the tokenizer
    if explorer is not None and (script_args.toy or explorer == TOY_MODEL):
        training_args.s2l_po_explorer_model = tiny_model_path()
    value_model = getattr(training_args, "sppo_value_model", None)  # SPPO's value model shares the policy's tokenizer
    if value_model is not None and (script_args.toy or value_model == TOY_MODEL):
        training_args.sppo_value_model = tiny_model_path()
    if script_args.toy or script_args.dataset_name == TOY_DATASET:
        train_dataset = arithmetic_dataset(n=1024, seed=training_args.seed)
        if training_args.rollout_filter == "consistency_grpo":  # the toy has no paraphrase column: build its own
            from .toy.paraphrases import add_arithmetic_paraphrases

            train_dataset = add_arithmetic_paraphrases(train_dataset, training_args.consistency_grpo_column)
    else:
        train_dataset = load_dataset(script_args.dataset_name, name=script_args.dataset_config)[
            script_args.dataset_train_split
        ]
    rollout_func = None
    rollout_kwargs = _rollout_kwargs(script_args, training_args)
    if script_args.rollout is not None:
        if script_args.rollout not in _rollouts():
            raise ValueError(f"rollout: unknown rollout {script_args.rollout!r}; registered: {sorted(_rollouts())}.")
        rollout_func = _rollouts()[script_args.rollout](**rollout_kwargs)
    rewards = [arithmetic_reward] if script_args.toy else resolve_reward_funcs(
        script_args.reward_funcs, script_args.allow_reward_imports
    )
    if script_args.toy:  # rewards written for the toy task itself (`toy_task`, e.g. a rule-based PRM) are kept
        registered = _reward_funcs()
        rewards += [registered[n] for n in script_args.reward_funcs[1:] if getattr(registered.get(n), "toy_task", 0)]
    rewards = _bind_rewards(rewards, training_args)
    if model_args.dtype not in (None, "auto") and training_args.model_init_kwargs is None:
        training_args.model_init_kwargs = {"dtype": model_args.dtype}
    trainer = GRPOTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=rewards,
        args=training_args,
        train_dataset=train_dataset,
        processing_class=processing_class,
        peft_config=get_peft_config(model_args),
        quantization_config=get_quantization_config(model_args),
        rollout_func=rollout_func,
    )
    if script_args.headroom_probe_prompts < 0 or script_args.headroom_probe_samples < 1:
        raise ValueError("headroom_probe_prompts must be >= 0 (0 = off) and headroom_probe_samples >= 1.")
    if script_args.headroom_probe_prompts:
        from .diagnostics import HeadroomProbe

        rows = train_dataset.select(range(min(script_args.headroom_probe_prompts, len(train_dataset))))
        probe = HeadroomProbe(rows, rewards[0], num_samples=script_args.headroom_probe_samples)
        trainer.add_callback(probe.bind(trainer))
    return trainer


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    at = argv.index("--plan") if "--plan" in argv else -1
    if at >= 0 and argv[at + 1: at + 2] not in (["false"], ["False"]):
        argv += ["--use_cpu", "true"]  # the plan reads no device setting: let bf16 recipes parse without a GPU
    script_args, training_args, model_args = make_parser().parse_args_and_config(argv)
    if script_args.plan:  # answer before anything is loaded
        from .memory import plan_from_config

        toy = script_args.toy or model_args.model_name_or_path == TOY_MODEL
        model = None
        if toy:
            from .toy import tiny_model_path

            model = tiny_model_path()
        print(plan_from_config(training_args, model_args, model=model, prompt_length=script_args.plan_prompt_length,
                               gpu_memory_gib=script_args.plan_gpu_gb).report())
        return
    trainer = build_trainer(script_args, training_args, model_args)
    # the model card (trl_groupx/model_card.py) shows the recipe the run was trained from
    trainer.recipe_path = argv[argv.index("--config") + 1] if "--config" in argv[:-1] else None
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    trainer.save_state()  # trainer_state.json (log history) in output_dir: `trl-groupx plot <output_dir>` reads it
    trainer.accelerator.print(f"Model saved to {training_args.output_dir}.")
