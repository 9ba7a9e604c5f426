"""The save phase: what saving a checkpoint or the final model gathers on the device and copies to the host.

- :mod:`.gathers`: the save paths of transformers 5.23's Trainer under FSDP (accelerate 1.15 ``FULL_STATE_DICT`` /
  ``SHARDED_STATE_DICT``) and DeepSpeed ZeRO-3 (0.19.8 ``stage3_gather_16bit_weights_on_model_save``), each read
  from the installed source: the largest tensor gathered at once on rank 0's device and the state dict rank 0
  holds on the host; ``Phase.SAVE`` and its components.
"""

from fitcheck.core.saving.gathers import SaveCost, save_components, save_cost, save_findings

__all__ = ["SaveCost", "save_components", "save_cost", "save_findings"]
