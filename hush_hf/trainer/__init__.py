"""DP training with a protection plan inside transformers' Trainer (Hush, Alg. 2, lines 6-12).

``SecretProtectionConfig`` (TrainingArguments + DP and planning fields), ``SecretProtectionTrainer``
(plans from secrets, trains with weighted Poisson sampling, ghost clipping and calibrated noise), and
``GhostClippingCallback`` (the DP step itself; ``GhostClippingCallback.attach(trainer, plan)`` for a
plain ``Trainer``).
"""

from hush_hf.trainer.callback import GhostClippingCallback
from hush_hf.trainer.config import SecretProtectionConfig
from hush_hf.trainer.trainer import SecretProtectionTrainer

__all__ = ["GhostClippingCallback", "SecretProtectionConfig", "SecretProtectionTrainer"]
