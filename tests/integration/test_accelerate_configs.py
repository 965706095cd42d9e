"""recipes/accelerate/: every launcher config loads with accelerate's own config loader (nothing is launched), and
every `accelerate launch` command line in docs/multi-gpu.md parses with accelerate's launch parser and points at
files that exist."""

import re
import shlex
from pathlib import Path

import pytest
import yaml
from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
from accelerate.commands.launch import launch_command_parser
from accelerate.utils import DistributedType

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "recipes" / "accelerate").glob("*"))
EXPECTED = {
    "multi_gpu.yaml": (DistributedType.MULTI_GPU, {}),
    "deepspeed_zero2.yaml": (DistributedType.DEEPSPEED, {"zero_stage": 2}),
    "deepspeed_zero3.yaml": (DistributedType.DEEPSPEED, {"zero_stage": 3}),
    "fsdp2.yaml": (DistributedType.FSDP, {"fsdp_version": 2}),
}


def test_every_launcher_is_there():
    assert sorted(p.name for p in CONFIGS) == sorted(EXPECTED)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_loads_with_accelerate(path):
    config = load_config_from_file(str(path))  # raises on unknown top-level keys
    assert isinstance(config, ClusterConfig)
    distributed_type, expected = EXPECTED[path.name]
    assert config.distributed_type == distributed_type
    assert config.num_machines == 1 and config.num_processes >= 2
    assert config.mixed_precision == "bf16" and not config.use_cpu
    nested = {**(config.deepspeed_config or {}), **(config.fsdp_config or {})}
    assert expected.items() <= nested.items()
    # the loader does not check nested keys: `accelerate launch` copies each one onto the launch argument of the same
    # name, so each must be one
    launch_args = {action.dest for action in launch_command_parser()._actions}
    unknown = sorted(set(nested) - launch_args)
    assert not unknown, f"{path.name}: {unknown} are not accelerate launch arguments"
    raw = yaml.safe_load(path.read_text())
    assert raw["distributed_type"] == distributed_type.value


def _doc_commands() -> list[str]:
    text = (ROOT / "docs" / "multi-gpu.md").read_text().replace("\\\n", " ")
    return [m.group(1) for m in re.finditer(r"accelerate launch (.+)", text)]


def test_doc_commands_parse():
    commands = _doc_commands()
    assert len(commands) >= 8
    used = set()
    for line in commands:
        args = launch_command_parser().parse_args(shlex.split(line))
        assert args.module and args.training_script == "trl_groupx.cli", line
        assert (ROOT / args.config_file).is_file(), line
        used.add(Path(args.config_file).name)
        assert args.training_script_args[:2] == ["grpo", "--config"], line
        assert (ROOT / args.training_script_args[2]).is_file(), line
    assert used == set(EXPECTED)
