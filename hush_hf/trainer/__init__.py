"""DP training with a protection plan inside transformers' Trainer (Hush, Alg. 2, lines 6-12).

``SecretProtectionConfig`` (TrainingArguments + DP and planning fields), ``SecretProtectionTrainer``
(plans from secrets, trains with weighted Poisson sampling, ghost clipping and calibrated noise), and
``GhostClippingCallback`` (the DP step itself; ``GhostClippingCallback.attach(trainer, plan)`` for a
plain ``Trainer``). ``BertForMaskedPositionsLM`` / ``MaskedPositionsTrainer``: a BERT MLM whose output
head runs only at the masked positions (same per-example losses and gradients, 4-5x less work).
"""

from hush_hf.trainer.callback import GhostClippingCallback
from hush_hf.trainer.config import SecretProtectionConfig
from hush_hf.trainer.masked_positions import (
    BertForMaskedPositionsLM,
    MaskedPositionsTrainer,
    masked_positions_loss,
)
from hush_hf.trainer.trainer import SecretProtectionTrainer

__all__ = [
    "BertForMaskedPositionsLM",
    "GhostClippingCallback",
    "MaskedPositionsTrainer",
    "SecretProtectionConfig",
    "SecretProtectionTrainer",
    "masked_positions_loss",
]
