"""SecretProtectionConfig: ``TrainingArguments`` for DP training with a protection plan (TRL style)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from transformers import TrainingArguments

from hush_hf.accounting.accountants import DEFAULT_ACCOUNTANT
from hush_hf.sampling.seeds import check_dp_seed
from hush_hf.trainer.plan_setup import loud_warning
from hush_hf.trainer.seed_store import resolve_dp_state_dir
from hush_hf.trainer.validation import (
    check_dp_training_arguments,
    check_flag,
    check_name,
    check_noise_multiplier,
    check_path,
    check_positive,
)

REDACTED_SEED = "<DP_SEED>"


@dataclass
class SecretProtectionConfig(TrainingArguments):
    r"""
    Configuration for [`SecretProtectionTrainer`]: every [`~transformers.TrainingArguments`] field plus the
    ones below. Usable from [`~transformers.HfArgumentParser`].

    One optimizer step is one DP step (Hush, Alg. 2): a Poisson batch of B examples in expectation is
    drawn, split into micro-batches of at most `per_device_train_batch_size` rows per process, every
    example's gradient is clipped to norm C, Gaussian noise of std `noise_multiplier * C` is added once
    and the sum is divided by B.

    Parameters:
        > Parameters that control differential privacy

        per_example_clip_norm (`float`, *optional*, defaults to `1.0`):
            C: every example's gradient (over all trainable parameters) is scaled to norm at most C.
        expected_batch_size (`float` or `None`, *optional*, defaults to `None`):
            B, the expected size of the logical (Poisson) batch; the noisy gradient sum is divided by B.
            `None`: the plan's B when a plan is given, else `per_device_train_batch_size * world_size`.
        noise_multiplier (`float` or `None`, *optional*, defaults to `None`):
            sigma, in units of C. `None` uses the plan's calibrated value (recommended). A smaller value,
            or `0` (no noise, a non-private baseline), is allowed with a loud warning that the certified
            per-secret targets do not hold.
        dp_seed (`int` or `None`, *optional*, defaults to `None`):
            Seed of the sampling and noise randomness. `None` (recommended) draws 128 secret bits at
            train start; they are kept only in `dp_state_dir`, never in `output_dir`. Anyone who knows the
            seed can remove the noise: set it only for reproducible tests (the training record, model card
            and `hush verify` then say the seed was set by the user). It is redacted from `to_dict()`,
            `repr()` and the pickled `training_args.bin` (so a pickled or deep-copied config has
            `dp_seed=None`).
        dp_state_dir (`str` or `None`, *optional*, defaults to `None`):
            Private folder the secret seed is written to when a checkpoint is saved (file
            `<run id>.json`, owner-only), so that a resumed run draws exactly the batches and noise the
            interrupted one drew; checkpoints record only the run id. `None`: `$HUSH_HF_DP_STATE_DIR`, else
            `~/.cache/hush_hf/dp_state`. Must lie outside `output_dir` (an upload of `output_dir` would
            take it). Without the seed file a resume is refused (why: `hush_hf.trainer.seed_store`).

        > Parameters that control the protection plan

        secrets_file (`str` or `None`, *optional*, defaults to `None`):
            A `.json`/`.jsonl`/`.csv` secrets file (id, prior, target, optional terms/pattern). The trainer
            tags `train_dataset` with it (unless it has a `secret_ids` column) and computes the plan.
        plan_file (`str` or `None`, *optional*, defaults to `None`):
            A plan saved by `ProtectionPlan.save` or `hush plan`; used instead of computing one.
        secrets_text_column (`str`, *optional*, defaults to `"text"`):
            The column the secrets are searched in when tagging.
        accountant (`str`, *optional*, defaults to `"tight"`):
            How the noise is calibrated: `"tight"`, `"rdp"` or `"kl"` (the paper's Lemma 3.2).
        lp_c (`float`, *optional*, defaults to `1.0`):
            The LP constant c (Hush, eq. 1): smaller c keeps less data and needs less noise.
        allow_unmatched_secrets (`bool`, *optional*, defaults to `False`):
            A secret that marks no example is an error (mistyped terms, or data tagged with other
            secrets); `True` accepts it, and the plan, report and card count such secrets.

        > Parameters of the CRT mode (Confidentially Redacted Training, CRT Alg. 1)

        crt_schedule (`str`, *optional*, defaults to `"off"`):
            `"off"`: every step is a DP step. `"alternate_epochs"` (CRT Alg. 1): an epoch of public steps,
            then `max(1, round(n_private / B))` DP steps, repeated until the T DP steps are taken;
            `"interleave"`: one public step before every DP step. A public step is an ordinary step (mean
            loss gradient, no clipping, no noise) on rows whose `crt_public_column` is true; those rows must
            have no tagged secret (checked). The T DP steps are exactly those of a run without CRT mode and
            every per-secret bound of the plan still holds (why: `hush_hf.trainer.crt`). `max_steps` stays
            T; the run takes T + (public steps) optimizer steps and the learning-rate schedule spans them
            all. Resuming a CRT run from a checkpoint is not supported.
        crt_public_column (`str`, *optional*, defaults to `"crt_public"`):
            Bool column marking public rows (`hush_hf.crt.redact_dataset` adds it).
        crt_public_batch_size (`int` or `None`, *optional*, defaults to `None`):
            Rows per public step (all processes together); `None`: `round(B)`.
        crt_recall (`float` or `None`, *optional*, defaults to `None`):
            The measured recall (1 - false-negative rate gamma) of the redaction policies on the secrets
            they are meant to find. Given, the privacy report and model card state CRT's Bayesian
            confidentiality log(1 + gamma (e^eps - 1)) for secrets no tagger marks (CRT Prop. 6, Thm. 8.3);
            hush_hf cannot check the number.
        crt_conservative_recall (`float` or `None`, *optional*, defaults to `None`):
            Recall of the policy that decided the public rows (pi_c); `None`: `crt_recall`.

    Defaults that differ from [`~transformers.TrainingArguments`]:
        max_grad_norm (`float`, defaults to `0.0`):
            Batch-gradient clipping is off (and must stay off): clipping is per example.

    Meaning of inherited fields: `max_steps` (>= 1, required) is T, the number of DP steps the noise is
    calibrated for (`num_train_epochs` is not used); `per_device_train_batch_size` caps the physical
    micro-batch, not the logical batch B; `gradient_accumulation_steps` must stay 1 (micro-batches are
    accumulated inside the DP step). `gradient_checkpointing` (`activation_checkpointing`) is supported
    (two backward passes per micro-batch, see `hush_hf.clipping.recompute`), except under FSDP. Checked
    when the config is built: `fp16`, `torch_compile`, DeepSpeed, FSDP1 and FSDP2 with offloading, fp16
    or activation checkpointing, `auto_find_batch_size`, `ignore_data_skip`,
    `label_smoothing_factor`, a `train_sampling_strategy` other than `"random"`, pushing checkpoints
    to the Hub, `include_num_input_tokens_seen` and `WANDB_WATCH=gradients|all` with wandb reporting
    (they log statistics of the pre-noise step) are refused. The training loss and `dp_batch_size` that
    are logged are not noised: keep logs private like the data.
    """

    # Parameters that control differential privacy
    per_example_clip_norm: float = field(
        default=1.0,
        metadata={"help": "C: every example's gradient is clipped to this L2 norm."},
    )
    expected_batch_size: float | None = field(
        default=None,
        metadata={
            "help": "B: expected size of the logical Poisson batch (default: the plan's B, else "
            "per_device_train_batch_size * world_size)."
        },
    )
    noise_multiplier: float | None = field(
        default=None,
        metadata={
            "help": "sigma in units of C (default: the plan's calibrated value; "
            "0 = no noise, baselines only)."
        },
    )
    dp_seed: int | None = field(
        default=None,
        repr=False,
        metadata={
            "help": "Seed of the DP sampling and noise. Leave unset (a secret 128-bit seed is drawn); anyone "
            "who knows it can remove the noise. For reproducible tests only."
        },
    )
    dp_state_dir: str | None = field(
        default=None,
        metadata={
            "help": "Private folder (outside output_dir) keeping the secret DP seed for resuming "
            "(default: $HUSH_HF_DP_STATE_DIR or ~/.cache/hush_hf/dp_state)."
        },
    )

    # Parameters that control the protection plan
    secrets_file: str | None = field(
        default=None,
        metadata={"help": "Secrets file (.json/.jsonl/.csv): the dataset is tagged and the plan computed."},
    )
    plan_file: str | None = field(
        default=None,
        metadata={"help": "A saved protection plan (hush plan / ProtectionPlan.save) to train with."},
    )
    secrets_text_column: str = field(
        default="text",
        metadata={"help": "Column of train_dataset the secrets are searched in when tagging."},
    )
    accountant: str = field(
        default=DEFAULT_ACCOUNTANT,
        metadata={"help": "Accountant calibrating the noise (hush_hf.accounting.ACCOUNTANTS)."},
    )
    lp_c: float = field(
        default=1.0,
        metadata={"help": "LP constant c of the plan (Hush eq. 1)."},
    )
    allow_unmatched_secrets: bool = field(
        default=False,
        metadata={"help": "Accept secrets that mark no example (an error by default)."},
    )

    # CRT mode
    crt_schedule: str = field(
        default="off",
        metadata={
            "help": "CRT mode: off, alternate_epochs (CRT Alg. 1) or interleave; public steps train rows of "
            "crt_public_column without clipping or noise.",
            "choices": ["off", "alternate_epochs", "interleave"],
        },
    )
    crt_public_column: str = field(
        default="crt_public",
        metadata={"help": "Bool column marking the public rows (hush_hf.crt.redact_dataset adds it)."},
    )
    crt_public_batch_size: int | None = field(
        default=None,
        metadata={"help": "Rows per public step (default: round(B))."},
    )

    crt_recall: float | None = field(
        default=None,
        metadata={"help": "Measured recall of the redaction policies (report/card: CRT confidentiality)."},
    )
    crt_conservative_recall: float | None = field(
        default=None,
        metadata={"help": "Measured recall of the policy deciding the public rows (default: crt_recall)."},
    )

    # Defaults that differ from TrainingArguments
    max_grad_norm: float = field(
        default=0.0,
        metadata={
            "help": "Must be 0: gradients are clipped per example (per_example_clip_norm), not per batch."
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_dp_training_arguments(self)
        check_positive("per_example_clip_norm", self.per_example_clip_norm)
        check_positive("expected_batch_size", self.expected_batch_size, allow_none=True)
        check_noise_multiplier(self.noise_multiplier)
        check_positive("lp_c", self.lp_c)
        from hush_hf.accounting import ACCOUNTANTS

        if self.accountant not in ACCOUNTANTS:
            raise ValueError(f"accountant must be one of {tuple(ACCOUNTANTS)}, got {self.accountant!r}")
        for name in ("secrets_file", "plan_file", "dp_state_dir"):
            check_path(name, getattr(self, name))
        if self.secrets_file is not None and self.plan_file is not None:
            raise ValueError("give secrets_file or plan_file, not both")
        check_name("secrets_text_column", self.secrets_text_column)
        check_name("crt_public_column", self.crt_public_column)
        check_flag("allow_unmatched_secrets", self.allow_unmatched_secrets)
        if self.dp_seed is not None:
            check_dp_seed(self.dp_seed)
        resolve_dp_state_dir(self.dp_state_dir, self.output_dir)
        from hush_hf.trainer.crt import CRT_SCHEDULES

        if self.crt_schedule not in CRT_SCHEDULES:
            raise ValueError(f"crt_schedule must be one of {CRT_SCHEDULES}, got {self.crt_schedule!r}")
        size = self.crt_public_batch_size
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ValueError(f"crt_public_batch_size must be None or an integer >= 1, got {size!r}")
        for name in ("crt_recall", "crt_conservative_recall"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not 0 <= value <= 1):
                raise ValueError(f"{name} must be None or a number in [0, 1], got {value!r}")

    # The seed never leaves the process through the config: logs, reporting integrations and
    # training_args.bin all see it redacted.
    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        if d.get("dp_seed") is not None:
            d["dp_seed"] = REDACTED_SEED
        return d

    def __str__(self) -> str:
        shown = {k: f"<{k.upper()}>" if k.endswith("_token") else v for k, v in asdict(self).items()}
        if shown.get("dp_seed") is not None:
            shown["dp_seed"] = REDACTED_SEED
        body = "".join(f"{k}={v},\n" for k, v in sorted(shown.items()))
        return f"{type(self).__name__}(\n{body})"

    __repr__ = __str__

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["dp_seed"] = None
        return state


def as_secret_protection_config(args: TrainingArguments | None) -> SecretProtectionConfig:
    """``args`` itself if it is a SecretProtectionConfig, else one with the same TrainingArguments fields.

    A plain ``TrainingArguments`` (a standard script) has ``max_grad_norm=1.0`` by default: batch
    clipping has no place in DP-SGD, so it is turned off with a warning.
    """
    if isinstance(args, SecretProtectionConfig):
        return args
    if args is None:
        raise ValueError(
            "args is required: a SecretProtectionConfig (or TrainingArguments) with max_steps = T"
        )
    if not isinstance(args, TrainingArguments):
        raise ValueError(f"args must be a TrainingArguments, got a {type(args).__name__}")
    values = {f.name: getattr(args, f.name) for f in fields(args) if f.init}
    batch_clip = values.get("max_grad_norm")
    values["max_grad_norm"] = 0.0
    config = SecretProtectionConfig(**values)
    if batch_clip:
        loud_warning(
            f"max_grad_norm={batch_clip!r} (batch-gradient clipping) is turned off: DP training clips "
            "every example's gradient at per_example_clip_norm instead"
        )
    return config
