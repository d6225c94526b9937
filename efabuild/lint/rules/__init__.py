"""The guide's pitfalls as rules over one layer (its Dockerfile text, args and what it inherits),
one module per concern; importing them registers each rule in LAYER_RULES by its ID.
"""

from efabuild.lint.rules import credentials, gpu_arch, installer, nccl_env, pins, platforms
from efabuild.lint.rules.registry import LAYER_RULES

__all__ = ["LAYER_RULES", "credentials", "gpu_arch", "installer", "nccl_env", "pins", "platforms"]
