"""Secret reconstruction: does the model single out the true secret among candidates in its contexts?

For secret j the attacker sees the contexts in which it occurs, with the secret cut out, and a set of
candidates (the true value plus alternatives). Candidate c gets the score sum_k log P(context_k with
c in the gap): a causal LM scores the whole text with c substituted (the prefix is shared, so this
ranks by the continuation c||suffix); a masked LM fills as many [MASK] tokens as c has and scores
sum_i log P(c_i at mask i) (all masks filled at once, the usual fill-in attack). With a uniform prior
over the candidates, softmax of the scores is the attacker's posterior; we report the true value's
posterior ("probability") and rank (ties one half) next to the plan's certified bound b_j on *any*
attacker's success probability for that secret (Hush Def. 3.1), which holds for an attacker whose
prior is p_j. The measured attacker's prior is q = 1/#candidates (exactly so for canaries, whose
alternatives are drawn from the same uniform space). The bound at prior q follows from the
blow-up function B (Hayes, Balle, Mahloujifar 2023, Thm. 2: success <= B(q)), which is concave with
B(0) >= 0, so B(q)/q does not increase with q: for q >= p_j, B(q) <= q b_j / p_j; for q < p_j,
B(q) <= b_j. ``bound_at_candidate_prior`` = min(1, that) is therefore a valid, if loose, bound on the
measured attacker's expected posterior; a secret above it is a single draw, the mean is what is bounded.

Results name secrets by index only; contexts and candidates never leave this module.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from hush_hf.audit.canaries import PLACEHOLDER, Canary
from hush_hf.audit.scoring import (
    ModelKind,
    check_positive_int,
    encode,
    logits_of,
    model_device,
    model_kind,
    pad,
    sequence_log_probs,
)

Context = tuple[str, str, str]  # (text before, the secret as written, text after)


@dataclass(frozen=True, repr=False)
class SecretProbe:
    """Secret ``index``: the contexts it occurs in and alternative values to rank it against."""

    index: int
    contexts: tuple[Context, ...]
    alternatives: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.contexts:
            raise ValueError(f"secret #{self.index}: a probe needs at least one context")
        if not self.alternatives:
            raise ValueError(f"secret #{self.index}: a probe needs at least one alternative value")

    def __repr__(self) -> str:
        return (f"SecretProbe(index={self.index}, {len(self.contexts)} contexts, "
                f"{len(self.alternatives)} alternatives)")

    __str__ = __repr__


def term_pattern(term: str) -> re.Pattern[str]:
    r"""A case-insensitive regex for ``term`` as whole words: its words joined by ``\W+``.

    Mirrors the tagger's matching (:mod:`hush_hf.secrets.words`) on raw text, so a context can be cut
    around the occurrence ("New-York" is found for the term "new york").
    """
    pieces = re.findall(r"\w+", term)
    if not pieces:
        raise ValueError("term contains no word characters")
    return re.compile(r"(?<!\w)" + r"\W+".join(map(re.escape, pieces)) + r"(?!\w)", re.IGNORECASE)


def locate_contexts(texts: Sequence[str], patterns: Sequence[re.Pattern[str]], *, window: int = 200,
                    max_contexts: int = 4) -> list[Context]:
    """Up to ``max_contexts`` (before, match, after) cuts, ``window`` characters each side, in text order."""
    window = check_positive_int("window", window)
    max_contexts = check_positive_int("max_contexts", max_contexts)
    found: list[Context] = []
    for text in texts:
        for pattern in patterns:
            for match in pattern.finditer(text):
                start, end = match.span()
                found.append((text[max(0, start - window):start], match.group(0), text[end:end + window]))
                if len(found) == max_contexts:
                    return found
    return found


def secret_patterns(secret: Any) -> list[re.Pattern[str]]:
    """How to find a :class:`hush_hf.secrets.Secret` in raw text: its terms (or name) and its pattern."""
    patterns = [term_pattern(t) for t in (secret.terms or ((secret.name,) if secret.pattern is None else ()))]
    if secret.pattern is not None:
        patterns.append(re.compile(secret.pattern))
    return patterns


def probes_for_secrets(
    secrets: Sequence[Any],
    texts: Sequence[str],
    secret_ids: Sequence[Sequence[int]],
    *,
    alternatives: Mapping[int, Sequence[str]] | Callable[[int], Sequence[str]] | None = None,
    num_alternatives: int = 20,
    indices: Sequence[int] | None = None,
    pool: Sequence[int] | None = None,
    window: int = 200,
    max_contexts: int = 4,
    seed: int = 0,
) -> tuple[list[SecretProbe], dict[int, str]]:
    """Probes for the secrets in ``indices`` (default: all) from tagged texts.

    Contexts come from the examples tagged with j (``secret_ids[i]`` lists the secrets of text i).
    Alternatives are given per secret, or default to ``num_alternatives`` other secrets' first terms
    drawn at random (seeded) from ``pool`` (secret indices, default all), values of the same kind
    (e.g. words of similar frequency).
    Returns the probes and, for secrets that could not be probed, the reason (not silently dropped).
    """
    if len(texts) != len(secret_ids):
        raise ValueError(f"texts has {len(texts)} rows but secret_ids has {len(secret_ids)}")
    num_alternatives = check_positive_int("num_alternatives", num_alternatives)
    wanted = range(len(secrets)) if indices is None else [int(j) for j in indices]
    for field, group in (("indices", wanted), ("pool", pool or ())):
        outside = [j for j in group if not 0 <= int(j) < len(secrets)]
        if outside:
            raise ValueError(f"{field} holds {outside[0]}, outside [0, {len(secrets)})")
    examples: dict[int, list[int]] = {j: [] for j in wanted}
    for i, ids in enumerate(secret_ids):
        for j in ids:
            if j in examples:
                examples[j].append(i)
    values_of = [s.terms[0] if s.terms else s.name for s in secrets]
    pool = list(range(len(secrets))) if pool is None else [int(k) for k in pool]
    rng = np.random.default_rng(seed)
    probes, skipped = [], {}
    for j in wanted:
        if not examples[j]:
            skipped[j] = "no tagged examples"
            continue
        contexts = locate_contexts([texts[i] for i in examples[j]], secret_patterns(secrets[j]),
                                   window=window, max_contexts=max_contexts)
        if not contexts:
            skipped[j] = "secret not found verbatim in its tagged examples"
            continue
        if alternatives is None:
            others = [k for k in pool if k != j]
            if not others:
                skipped[j] = "no other secrets to draw alternatives from"
                continue
            picked = rng.choice(others, size=min(num_alternatives, len(others)), replace=False)
            values = [values_of[k] for k in picked]
        else:
            values = list(alternatives(j) if callable(alternatives) else alternatives.get(j, ()))
        written = {c[1].casefold() for c in contexts}
        values = [v for v in dict.fromkeys(values) if v.casefold() not in written]
        if not values:
            skipped[j] = "no alternatives"
            continue
        probes.append(SecretProbe(j, tuple(contexts), tuple(values)))
    return probes, skipped


def canary_probes(canaries: Sequence[Canary], secret_indices: Sequence[int], *, num_alternatives: int = 1000,
                  seed: int = 0) -> list[SecretProbe]:
    """Probes for canaries declared as secrets ``secret_indices``: the template is the context and
    the alternatives are distinct values drawn uniformly from R. The canary, itself uniform on R, is
    then uniform among its candidates: the measured attacker's prior is exactly 1/#candidates."""
    if len(canaries) != len(secret_indices):
        raise ValueError(f"{len(canaries)} canaries but {len(secret_indices)} secret indices")
    rng = np.random.default_rng(seed)
    probes = []
    for canary, j in zip(canaries, secret_indices, strict=True):
        before, after = canary.space.template.split(PLACEHOLDER)
        drawn = dict.fromkeys(canary.space.random_values(num_alternatives, rng))
        values = [v for v in drawn if v != canary.value]
        probes.append(SecretProbe(int(j), ((before, canary.value, after),), tuple(values)))
    return probes


def input_length(tokenizer: Any, kind: ModelKind, context: Context, values: Sequence[str]) -> int:
    """The longest model input scoring ``values`` in ``context`` takes, in tokens: the whole text for a
    causal LM, the masked input of ``masked_fill_scores`` for a masked one."""
    before, _, after = context
    if kind == "masked":
        head, tail = special_wrapping(tokenizer)
        sides = encode(tokenizer, [before, after], add_special_tokens=False)
        longest = max(len(ids) for ids in encode(tokenizer, values, add_special_tokens=False))
        return len(head) + len(sides[0]) + longest + len(sides[1]) + len(tail)
    return max(len(ids) for ids in encode(tokenizer, [before + value + after for value in values]))


def fit_probe(probe: SecretProbe, tokenizer: Any, max_length: int, kind: ModelKind) -> SecretProbe | None:
    """``probe`` with each context cut (the characters nearest the secret kept) until every candidate's
    input fits in ``max_length`` tokens (the model's positions); None if a candidate alone does not fit.
    Every candidate of a context is scored in the same cut context, so ranks stay comparable."""
    contexts = []
    for before, written, after in probe.contexts:
        candidates = (written, *probe.alternatives)
        while (length := input_length(tokenizer, kind, (before, written, after), candidates)) > max_length:
            if not before and not after:
                return None
            share = min(0.95, 0.95 * max_length / length)  # about what fits, then check again
            keep_before, keep_after = int(len(before) * share), int(len(after) * share)
            if keep_before == len(before) and keep_after == len(after):
                keep_before, keep_after = len(before) // 2, len(after) // 2
            before, after = before[len(before) - keep_before:], after[:keep_after]
        contexts.append((before, written, after))
    return SecretProbe(probe.index, tuple(contexts), probe.alternatives)


def _causal_scores(model: Any, tokenizer: Any, probe: SecretProbe, batch_size: int) -> np.ndarray:
    rows = []
    for before, written, after in probe.contexts:
        texts = [before + value + after for value in (written, *probe.alternatives)]
        rows.append(sequence_log_probs(model, encode(tokenizer, texts), batch_size=batch_size))
    return np.stack(rows)


def special_wrapping(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer puts before and after a text (e.g. [CLS] and [SEP] for BERT)."""
    bare = encode(tokenizer, ["a"], add_special_tokens=False)[0]
    full = encode(tokenizer, ["a"])[0]
    for start in range(len(full) - len(bare) + 1):
        if full[start:start + len(bare)] == bare:
            return full[:start], full[start + len(bare):]
    raise ValueError("cannot tell which special tokens the tokenizer adds around a text")


@torch.no_grad()
def masked_fill_scores(model: Any, tokenizer: Any, before: str, after: str, values: Sequence[str], *,
                       batch_size: int = 16) -> np.ndarray:
    """sum_i log P(value token i at mask i) of each value in ``before`` + masks + ``after``, one mask per
    token of the value, all filled at once (the fill-in score of a masked LM); -inf for an empty value."""
    mask_id = tokenizer.mask_token_id
    if mask_id is None:
        raise ValueError("the tokenizer has no mask token, so the model cannot be probed as a masked LM")
    batch_size = check_positive_int("batch_size", batch_size)
    model.eval()
    device = model_device(model)
    head, tail = special_wrapping(tokenizer)
    value_ids = encode(tokenizer, values, add_special_tokens=False)
    left = encode(tokenizer, [before], add_special_tokens=False)[0]
    right = encode(tokenizer, [after], add_special_tokens=False)[0]
    # One forward pass per distinct value length: the input (all masks) does not depend on the value.
    lengths = sorted({len(ids) for ids in value_ids})
    inputs = [head + left + [mask_id] * n + right + tail for n in lengths]
    offset = len(head) + len(left)  # position of the first mask in every input
    log_probs: dict[int, torch.Tensor] = {}
    for start in range(0, len(inputs), batch_size):
        ids, attention = pad(inputs[start:start + batch_size], side="right",
                             pad_id=tokenizer.pad_token_id or 0, device=device)
        logits = logits_of(model(input_ids=ids, attention_mask=attention)).float()
        for row, n in enumerate(lengths[start:start + batch_size]):
            log_probs[n] = torch.log_softmax(logits[row, offset:offset + n], dim=-1).double().cpu()
    return np.array([
        float(log_probs[len(ids)][torch.arange(len(ids)), torch.as_tensor(ids)].sum()) if ids else -np.inf
        for ids in value_ids
    ])


def _masked_scores(model: Any, tokenizer: Any, probe: SecretProbe, batch_size: int) -> np.ndarray:
    return np.stack([masked_fill_scores(model, tokenizer, before, after, (written, *probe.alternatives),
                                        batch_size=batch_size) for before, written, after in probe.contexts])


def candidate_scores(model: Any, tokenizer: Any, probe: SecretProbe, *, kind: ModelKind | None = None,
                     batch_size: int = 16) -> np.ndarray:
    """(contexts x candidates) log-likelihood scores; column 0 is the true value as written."""
    batch_size = check_positive_int("batch_size", batch_size)
    if model_kind(model, kind) == "masked":
        return _masked_scores(model, tokenizer, probe, batch_size)
    return _causal_scores(model, tokenizer, probe, batch_size)


@dataclass(frozen=True)
class SecretReconstruction:
    """How well the model reconstructs secret ``index``, next to the plan's numbers for it."""

    index: int
    num_contexts: int
    num_candidates: int
    rank: float
    probability: float
    candidate_prior: float
    prior: float | None = None
    target: float | None = None
    bound: float | None = None
    bound_at_candidate_prior: float | None = None

    @property
    def ranked_first(self) -> bool:
        return self.rank == 1.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ranked_first": self.ranked_first}


def reconstruct(index: int, scores: np.ndarray, plan: Any = None) -> SecretReconstruction:
    """Rank (ties one half) and softmax posterior of column 0 of summed ``scores`` (contexts x candidates)."""
    total = np.asarray(scores, dtype=np.float64).sum(axis=0)
    true = total[0]
    rank = 1.0 + float(np.sum(total[1:] > true)) + 0.5 * float(np.sum(total[1:] == true))
    shifted = total - total.max()
    probability = float(np.exp(shifted[0]) / np.exp(shifted).sum()) if np.isfinite(true) else 0.0
    extra = {}
    if plan is not None:
        secrets = plan.secrets
        if not 0 <= index < secrets.target.size:
            raise ValueError(f"secret index {index} is outside the plan's {secrets.target.size} secrets")
        prior, bound = float(secrets.prior[index]), float(secrets.bound[index])
        extra = {"prior": prior, "target": float(secrets.target[index]), "bound": bound,
                 "bound_at_candidate_prior": bound_at_prior(1.0 / total.size, prior, bound)}
    return SecretReconstruction(index, int(np.shape(scores)[0]), int(total.size), rank, probability,
                                1.0 / total.size, **extra)


def bound_at_prior(q: float, prior: float, bound: float) -> float:
    """A bound on B(q) from B(prior) <= bound: q * bound / prior for q >= prior (B concave, B(0) >= 0),
    bound for q < prior (B non-decreasing); never above 1."""
    return min(1.0, q * bound / prior if q >= prior else bound)


def reconstruction_attack(model: Any, tokenizer: Any, probes: Sequence[SecretProbe], *, plan: Any = None,
                          kind: ModelKind | None = None, batch_size: int = 16) -> list[SecretReconstruction]:
    """Score every probe's candidates and report each secret's rank and posterior (by index)."""
    return [reconstruct(p.index, candidate_scores(model, tokenizer, p, kind=kind, batch_size=batch_size),
                        plan) for p in probes]


def summarize_reconstructions(results: Sequence[SecretReconstruction],
                              not_evaluated: Mapping[int, str] | None = None) -> dict[str, Any]:
    """Counts and means over secrets, plus the per-secret rows (indices and numbers only)."""
    bounds = [r.bound for r in results if r.bound is not None]
    at_prior = [r.bound_at_candidate_prior for r in results if r.bound_at_candidate_prior is not None]
    reasons: dict[str, int] = {}
    for reason in (not_evaluated or {}).values():
        reasons[reason] = reasons.get(reason, 0) + 1
    return {
        "num_evaluated": len(results),
        "num_ranked_first": sum(r.ranked_first for r in results),
        "fraction_ranked_first": float(np.mean([r.ranked_first for r in results])) if results else None,
        "mean_probability": float(np.mean([r.probability for r in results])) if results else None,
        "mean_candidate_prior": float(np.mean([r.candidate_prior for r in results])) if results else None,
        "mean_bound": float(np.mean(bounds)) if bounds else None,
        "mean_bound_at_candidate_prior": float(np.mean(at_prior)) if at_prior else None,
        "not_evaluated": reasons,
        "secrets": [r.to_json() for r in results],
    }
