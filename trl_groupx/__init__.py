"""trl_groupx: TRL's GRPOTrainer/GRPOConfig with every GRPO variant from the literature as one config flag.

    from trl_groupx import GRPOConfig, GRPOTrainer

works exactly like TRL's classes; `trl_groupx.list_variants()` lists the variants and the flags that switch them on.
"""

from .config import GRPOConfig
from .contracts import ObjectiveContext, RolloutBatch, TokenContext
from .registry import Variant, get_variant, list_variants, register
from .trainer import GRPOTrainer

__version__ = "0.1.0"

__all__ = [
    "GRPOConfig",
    "GRPOTrainer",
    "ObjectiveContext",
    "RolloutBatch",
    "TokenContext",
    "Variant",
    "get_variant",
    "list_variants",
    "register",
]
