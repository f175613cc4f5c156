"""Noise calibration: the smallest sigma at which every secret's posterior bound meets its target.

Hush Algorithm 2 (lines 3-5) calibrates sigma by search; here the search is organised so that
few secrets need an exact evaluation:

1. the secrets with the largest estimated sigma_j (``Accountant.estimate_sigma``; the largest of each
   (prior, target) kind first) get their own sigma_j bracketed, lo_j < sigma_j <= hi_j with
   hi_j <= lo_j (1 + rtol) (or hi_j <= max_k lo_k, which already settles a secret): regula falsi
   in log sigma, then two probes either side of its root once the bracket is narrow; sigma = max hi_j;
2. every other secret is certified at sigma by a law that dominates its count S (``dominance``):
   first shared truncated-Poisson laws; then the likeliest failures are probed with their own
   laws (a failure sends us to 3 before any costly step); then envelopes of ever closer groups of
   secrets, then own laws. A bound from a dominating law is a valid bound for the secret;
3. secrets that fail even with their own law need more noise: the worst are bracketed as in 1,
   starting from their known excess at sigma and the slope of the last brackets; sigma grows, and
   2 repeats for the rest (certificates at a smaller sigma remain valid).

sigma is at most (1 + rtol) times the smallest sigma meeting all targets (the secret that sets it
fails at lo_j), and the returned sigma is checked: every secret holds a certified bound <= target.
The reported bounds are valid at sigma; those certified at a noticeably smaller sigma during the
search are re-evaluated at sigma (``REFRESH_GAP``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from tqdm.auto import tqdm

from hush_hf.accounting.accountants import DEFAULT_ACCOUNTANT, Accountant, get_accountant
from hush_hf.accounting.counts import (
    CountDistributions,
    poisson_binomial,
    poisson_dominating_rate,
    segment_sums,
)
from hush_hf.accounting.dominance import Cover, envelope_cover, poisson_cover
from hush_hf.accounting.groups import SecretGroups
from hush_hf.accounting.noiseless import noiseless_bounds
from hush_hf.accounting.threads import validate_workers
from hush_hf.accounting.validation import (
    validate_num_secrets,
    validate_priors,
    validate_rtol,
    validate_sigma,
    validate_steps,
    validate_targets,
)

#: Secrets bracketed per round (step 1 and 3).
CANDIDATES_PER_ROUND = 4
#: Estimates this close to the largest (at most MAX_REFINED of them) are re-ranked with their laws
#: before the first round (``_Search._law_aware``).
NEAR_TIE = 0.2
MAX_REFINED = 2048
#: Rounding ratios of the shared Poisson laws, then resolutions of the envelope groups.
POISSON_RATIOS = (1.1, 1.01)
ENVELOPE_RESOLUTIONS = (3e-2, 1e-3, 1e-4, 1e-5)
#: A shared-law cover is used only if each of its laws covers this many secrets on average.
MIN_SHARING = 4
#: Below this many pending secrets, go straight to their own laws.
SMALL_PENDING = 16
#: Secrets whose certificate is within this relative distance of their target are recomputed with their
#: own law at the final sigma (``_Search._meet_own_laws``), as verification recomputes them.
NEAR_TARGET = 1e-3
#: Doubling raises of sigma tried before that recomputation gives up (a bug guard: each doubles the step).
MAX_RAISES = 20
#: Secrets evaluated with their own law before the envelope steps (the most likely failures).
PROBES_PER_ROUND = 16
#: Brackets at most this many tolerances wide are closed with two probes either side of the root.
NARROW_BRACKET = 30
MAX_SIGMA = 1e9
#: Certificates issued at a sigma this much (relative) below the final one are re-evaluated.
REFRESH_GAP = 1e-2


@dataclass(frozen=True)
class NoiseCalibration:
    """Calibrated noise multiplier and, per secret, a rigorous posterior bound at that sigma."""

    sigma: float
    bounds: np.ndarray
    accountant: str
    evaluated_exactly: int


class _Evaluations:
    """Accountant calls, counted and shown by a progress bar."""

    def __init__(self, accountant: Accountant, steps: int, progress: bool, workers: int = 1) -> None:
        self.accountant = accountant
        self.steps = steps
        self.workers = workers
        self.bar = tqdm(desc=f"{accountant.name} evaluations", unit="law", disable=not progress)

    def __call__(
        self,
        laws: CountDistributions,
        sigma: np.ndarray | float,
        priors: np.ndarray,
        rows: np.ndarray,
        targets: np.ndarray | None,
    ) -> np.ndarray:
        """Bounds for queries (row, prior); ``targets``: what each is compared with (only lets ``tight``
        skip refinements that cannot change whether a bound meets it)."""
        sigma = np.broadcast_to(np.asarray(sigma, dtype=np.float64), (laws.num_rows,))
        out = self.accountant.evaluate(laws, sigma, self.steps, priors, rows, targets, self.workers)
        self.bar.update(laws.num_rows)
        return checked_bounds(out, priors, self.accountant.name, sigma[rows])

    def close(self) -> None:
        self.bar.close()


def checked_bounds(bounds: np.ndarray, priors: np.ndarray, accountant: str, sigma: np.ndarray) -> np.ndarray:
    """``bounds`` if every one is a number in [prior, 1], else a one-line RuntimeError.

    A posterior bound below its prior, or NaN, is a failed computation (the true posterior is at
    least the prior): it must stop the run, never be compared with a target (NaN <= r is False, but
    NaN > r is False too, and a report counting the latter would count it as held).
    """
    bounds = np.asarray(bounds, dtype=np.float64)
    bad = ~((bounds >= priors) & (bounds <= 1.0))
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        raise RuntimeError(
            f"the {accountant!r} accountant computed the bound {float(bounds[k])!r} for prior "
            f"{float(priors[k])!r} at sigma={float(np.broadcast_to(sigma, bounds.shape)[k])!r}; "
            "no bound is reported (a bug: please report it)"
        )
    return bounds


def posterior_bounds(
    groups: SecretGroups,
    priors: np.ndarray,
    sigma: float,
    steps: int,
    accountant: str = DEFAULT_ACCOUNTANT,
    *,
    resolution: float = 0.0,
    workers: int = 1,
) -> np.ndarray:
    """Rigorous upper bound on each secret's reconstruction posterior at noise ``sigma``.

    Each secret is evaluated with its own law of S (identical laws share one evaluation): one
    accountant evaluation per distinct law, ~20-50 ms each for ``tight``. ``resolution > 0`` trades
    tightness for speed: secrets whose laws agree to about that relative precision share the law
    of their envelope (a valid, slightly larger bound; see ``dominance``). Secrets whose examples
    are never sampled keep their prior. Every bound is the smaller of the accountant's and the
    noiseless blow-up function 1 - P(S=0)^T (1 - p) (``noiseless``: valid at every sigma, exact
    at sigma = 0, the limit of every accountant as sigma -> 0). ``workers``: threads for an accountant
    that can use them (``Accountant.threaded``; the bounds do not depend on it).
    """
    implementation = get_accountant(accountant)
    workers = validate_workers(workers)
    p = validate_priors(priors)
    validate_num_secrets(groups.num_secrets, p)
    sigma = validate_sigma(sigma)
    steps = validate_steps(steps)
    if isinstance(resolution, bool) or not isinstance(resolution, (int, float)) or not 0 <= resolution < 1:
        raise ValueError(f"resolution must be a number in [0, 1), got {resolution!r}")
    out = p.copy()
    active = np.flatnonzero(segment_sums(groups, groups.rho) > 0)
    if active.size == 0:
        return out
    noiseless = noiseless_bounds(poisson_dominating_rate(groups)[active], steps, p[active])
    if sigma == 0:  # the exact bound: every accountant's divergence is infinite here
        out[active] = noiseless
        return out
    laws = poisson_binomial(groups, active)
    cover = envelope_cover(laws, float(resolution))
    evaluate = _Evaluations(implementation, steps, False, workers)
    out[active] = np.minimum(evaluate(cover.laws, sigma, p[active], cover.row_of, None), noiseless)
    return out


def calibrate_noise(
    groups: SecretGroups,
    priors: np.ndarray,
    targets: np.ndarray,
    steps: int,
    accountant: str = DEFAULT_ACCOUNTANT,
    rtol: float = 1e-4,
    progress: bool = False,
) -> NoiseCalibration:
    """Smallest sigma (to relative precision ``rtol``) with every posterior bound <= its target.

    Returns sigma = 0 when no secret needs noise: each has no sampled example, or its noiseless
    bound 1 - P(S=0)^T (1 - p) already meets its target (examples so rarely sampled that
    P(ever sampled) <= (r - p) / (1 - p)); with any accountant.
    """
    implementation = get_accountant(accountant)
    validate_targets(priors, targets)
    p = np.asarray(priors, dtype=np.float64)
    r = np.asarray(targets, dtype=np.float64)
    validate_num_secrets(groups.num_secrets, p)
    steps = validate_steps(steps)
    rtol = validate_rtol(rtol)
    search = _Search(groups, p, r, steps, implementation, rtol, progress)
    try:
        return search.run()
    finally:
        search.evaluate.close()


class _Brackets:
    """Per-secret brackets lo < sigma_j <= hi with f = log(bound / target) at each end (Illinois:
    an end kept twice in a row has its f halved), and the last failing point before lo."""

    def __init__(self, k: int, floor: float) -> None:
        self.lo, self.hi = np.full(k, floor), np.full(k, np.inf)
        self.f_lo, self.f_hi = np.full(k, np.nan), np.full(k, np.nan)
        self.previous = np.full((k, 2), np.nan)  # the last failing (log sigma, f) before lo
        self.bound_hi = np.full(k, np.nan)
        self.kept = np.zeros(k)  # the end that stayed last time (-1 lo, +1 hi)

    def record(self, rows: np.ndarray, sigmas: np.ndarray, f: np.ndarray, bounds: np.ndarray) -> None:
        moved_lo, moved_hi = np.zeros(self.lo.size, dtype=bool), np.zeros(self.lo.size, dtype=bool)
        for j, x, fx, b in zip(rows, sigmas, f, bounds, strict=True):
            if fx <= 0 and x < self.hi[j]:
                self.hi[j], self.f_hi[j], self.bound_hi[j] = x, fx, b
                moved_hi[j] = True
            elif fx > 0 and x > self.lo[j]:
                with np.errstate(divide="ignore"):  # lo = 0 before the first failure: -inf, unused
                    self.previous[j] = (np.log(self.lo[j]), self.f_lo[j])
                self.lo[j], self.f_lo[j] = x, fx
                moved_lo[j] = True
        touched = np.unique(rows)
        only_hi = touched[moved_hi[touched] & ~moved_lo[touched]]
        only_lo = touched[moved_lo[touched] & ~moved_hi[touched]]
        # Illinois: halve the value kept at the end that did not move twice in a row.
        self.f_lo[only_hi] = np.where(self.kept[only_hi] == -1, 0.5 * self.f_lo[only_hi], self.f_lo[only_hi])
        self.f_hi[only_lo] = np.where(self.kept[only_lo] == 1, 0.5 * self.f_hi[only_lo], self.f_hi[only_lo])
        self.kept[only_hi], self.kept[only_lo] = -1, 1
        self.kept[touched[moved_hi[touched] & moved_lo[touched]]] = 0

    def slopes(self) -> np.ndarray:
        """d log(bound / target) / d log sigma across each closed bracket (negative)."""
        ok = (self.lo > 0) & np.isfinite(self.hi) & np.isfinite(self.f_lo) & np.isfinite(self.f_hi)
        ok &= self.hi > self.lo
        return (self.f_hi[ok] - self.f_lo[ok]) / (np.log(self.hi[ok]) - np.log(self.lo[ok]))


class _Search:
    """State of one calibration: certified bounds so far and the current sigma."""

    def __init__(
        self,
        groups: SecretGroups,
        priors: np.ndarray,
        targets: np.ndarray,
        steps: int,
        accountant: Accountant,
        rtol: float,
        progress: bool,
    ) -> None:
        self.groups, self.priors, self.targets, self.steps = groups, priors, targets, steps
        self.accountant = accountant
        self.tolerance = 0.9 * rtol
        self.evaluate = _Evaluations(accountant, steps, progress)
        self.mean = segment_sums(groups, groups.rho)
        self.bounds = np.full(groups.num_secrets, np.nan)
        self.certified = np.zeros(groups.num_secrets, dtype=bool)
        self.certified_at = np.zeros(groups.num_secrets)  # sigma of each certificate
        self.exact = np.zeros(groups.num_secrets, dtype=bool)
        self._rates: np.ndarray | None = None
        self._slope = 0.0  # d log(bound / target) / d log sigma of the last brackets (< 0 once known)

    @property
    def rates(self) -> np.ndarray:
        if self._rates is None:
            self._rates = poisson_dominating_rate(self.groups)
        return self._rates

    def run(self) -> NoiseCalibration:
        active = self.mean > 0
        self.bounds[~active] = self.priors[~active]
        self.certified[~active] = True
        # Secrets safe even without noise need none (any accountant: the noiseless bound is exact at
        # sigma = 0 and holds at every sigma). The others have it above their target, so taking the
        # minimum with it below changes no pass or fail, only the reported bounds.
        noiseless = noiseless_bounds(self.rates, self.steps, self.priors)
        safe = active & (noiseless <= self.targets)
        self._accept(np.flatnonzero(safe), noiseless[safe])
        active &= ~safe
        if not active.any():
            return NoiseCalibration(0.0, self.bounds, self.accountant.name, 0)
        estimate = self.accountant.estimate_sigma(self.mean, self.priors, self.targets, self.steps)
        sigma = self._bracket(self._first_candidates(np.flatnonzero(active), estimate), floor=0.0)
        probes = PROBES_PER_ROUND
        while True:
            pending, excess = self._certify_shared(np.flatnonzero(~self.certified), sigma)
            # Probe the most likely failures with their own laws before the costlier envelopes:
            # a failure there means sigma must grow, and the envelopes would be wasted.
            probe = pending[np.argsort(-excess, kind="stable")[:probes]]
            failing, fail_excess = self._certify_own(probe, sigma)
            if failing.size == 0:
                rest = np.flatnonzero(~self.certified)
                failing, fail_excess = self._certify_envelopes(rest, sigma)
            if failing.size == 0:
                break
            # Later rounds: about twice as many probes as failures were found (at least a round's worth).
            probes = min(PROBES_PER_ROUND, max(CANDIDATES_PER_ROUND, 2 * failing.size))
            worst = np.argsort(-fail_excess, kind="stable")[:CANDIDATES_PER_ROUND]
            sigma = max(sigma, self._bracket(failing[worst], floor=sigma, excess=fail_excess[worst]))
        self._refresh(sigma)
        self.bounds = np.where(active, np.minimum(self.bounds, noiseless), self.bounds)
        sigma = self._meet_own_laws(sigma, active)
        self._check(sigma)
        return NoiseCalibration(float(sigma), self.bounds.copy(), self.accountant.name, int(self.exact.sum()))

    def _refresh(self, sigma: float) -> None:
        """Tighten certificates issued at a sigma more than REFRESH_GAP below the final one:
        re-evaluate them at the final sigma (shared laws, own laws for the bracketed ones) and keep
        the smaller of two valid bounds. Closer certificates are kept as they are (still valid)."""
        stale_at = sigma / (1.0 + REFRESH_GAP)
        stale = np.flatnonzero(self.certified & (self.mean > 0) & (self.certified_at < stale_at))
        if stale.size == 0:
            return
        old = self.bounds[stale].copy()
        own = stale[self.exact[stale]]
        shared = stale[~self.exact[stale]]
        if shared.size:
            self._certify_shared(shared, sigma, refresh=True)
        if own.size:
            cover = envelope_cover(poisson_binomial(self.groups, own, self.mean), 0.0)
            fresh = self.evaluate(cover.laws, sigma, self.priors[own], cover.row_of, None)
            self.bounds[own] = np.minimum(self.bounds[own], fresh)
        self.bounds[stale] = np.minimum(self.bounds[stale], old)
        self.certified_at[stale] = sigma

    def _meet_own_laws(self, sigma: float, active: np.ndarray) -> float:
        """The least sigma >= ``sigma`` (to ``tolerance / 8``) at which every secret certified within
        :data:`NEAR_TARGET` of its target also meets it by :func:`posterior_bounds`, which is what ``hush
        verify`` and the trainer's re-verification compute. Every certificate is a valid bound, but one
        issued at a lower sigma or with an envelope law is discretised differently, and the own law's bound
        at the final sigma can come out a few 1e-6 above a target the certificate met (a fixed-seed search
        found one): the plan would then fail its own verification. Found by steps that double from
        ``tolerance / 8``, then bisection; certificates stay valid as sigma grows."""
        near = np.flatnonzero(active & (self.bounds > self.targets * (1.0 - NEAR_TARGET)))
        if near.size == 0:
            return sigma
        groups, priors, targets = self.groups.subset(near), self.priors[near], self.targets[near]

        def own(at: float) -> np.ndarray | None:
            bounds = posterior_bounds(groups, priors, at, self.steps, accountant=self.accountant.name)
            return bounds if np.all(bounds <= targets) else None

        step, lo, hi, found = self.tolerance / 8, sigma, sigma, own(sigma)
        for _ in range(MAX_RAISES):
            if found is not None:
                break
            lo, hi = hi, hi * (1.0 + step)
            step, found = 2 * step, own(hi)
        if found is None:  # pragma: no cover - a bug guard, not a code path
            raise RuntimeError(f"calibration: own-law bounds exceed their targets up to sigma={hi}")
        while hi > lo * (1.0 + self.tolerance / 8):
            mid = math.sqrt(lo * hi)
            bounds = own(mid)
            lo, hi, found = (lo, mid, bounds) if bounds is not None else (mid, hi, found)
        self.bounds[near] = np.minimum(self.bounds[near], found)
        return hi

    def _check(self, sigma: float) -> None:
        """Never return a sigma at which a secret lacks a certified bound <= its target."""
        ok = self.certified & np.isfinite(self.bounds) & (self.bounds <= self.targets)
        if not ok.all():  # pragma: no cover - a bug guard, not a code path
            j = int(np.flatnonzero(~ok)[0])
            raise RuntimeError(f"calibration failed to certify secret {j} at sigma={sigma}")

    # -- step 1 and 3: bracket sigma_j for a few secrets ------------------------------------------

    def _first_candidates(self, candidates: np.ndarray, estimate: np.ndarray) -> np.ndarray:
        """The secrets to bracket first: the largest estimate of each distinct (prior, target) pair, in
        order of estimate (at most CANDIDATES_PER_ROUND), filled up to half that with the next
        largest estimates.

        The estimate is Gaussian (exact as T grows); at small T its error depends on (p, r), and a
        plan's saturated secrets of different kinds tie in it, so one secret of each kind is tried.
        Other secrets of a kind are bracketed only if they fail at the resulting sigma: such a later
        round starts from their known excess and costs a few evaluations (on the bench's planned 100K
        instance, bracketing them up front cost 20 more). Near-ties of the largest estimate are
        re-ranked with their laws first (``_law_aware``).
        """
        estimate = self._law_aware(candidates, estimate)
        order = candidates[np.argsort(-estimate[candidates], kind="stable")]
        kinds = self.priors[order] + 1j * self.targets[order]  # 1-D keys: unique(axis=0) is 10x slower
        _, leaders = np.unique(kinds, return_index=True)
        leaders = np.sort(leaders)[:CANDIDATES_PER_ROUND]
        fill = max(0, CANDIDATES_PER_ROUND // 2 - leaders.size)
        rest = np.setdiff1d(np.arange(order.size), leaders)[:fill]
        return order[np.concatenate([leaders, rest])]

    def _law_aware(self, candidates: np.ndarray, estimate: np.ndarray) -> np.ndarray:
        """The estimate with E[S] replaced, for the near-ties of the largest (at most MAX_REFINED),
        by the mean of the Gaussian with the same chi-square divergence at sigma0 = the largest
        estimate: mu = sigma0 sqrt(log(1 + chi2)), chi2 = sum_{s,s'} pi_s pi_s' (e^{s s' / sigma0^2} - 1).

        mu -> E[S] as sigma0 grows; at small sigma it is larger for laws that put more mass on two or
        more examples at once, which need more noise than their mean says (a plan's saturated
        secrets tie in E[S] / gap; on the main job's plan at c = 2^-6 the secret that sets sigma was
        ranked 620th of 769 by E[S]). A ranking only: every sigma is still bracketed and certified.
        """
        top = float(estimate[candidates].max())
        near = candidates[np.argsort(-estimate[candidates], kind="stable")[:MAX_REFINED]]
        near = near[estimate[near] >= (1.0 - NEAR_TIE) * top]
        if near.size < 2 or top <= 0:
            return estimate
        laws = poisson_binomial(self.groups, near, self.mean)
        counts = np.arange(laws.pmf.shape[1], dtype=np.float64)
        exponent = np.minimum(np.outer(counts, counts) / top**2, 700.0)
        # sum pi_s pi_s' (e^x - 1): non-negative terms, no cancellation when sigma0 is large
        chi2 = np.einsum("js,st,jt->j", laws.pmf, np.expm1(exponent), laws.pmf)
        mu = top * np.sqrt(np.log1p(chi2))
        out = estimate.copy()
        out[near] = estimate[near] * mu / np.maximum(self.mean[near], 1e-300)
        return out

    def _bracket(self, secrets: np.ndarray, floor: float, excess: np.ndarray | None = None) -> float:
        """Bracket sigma_j for ``secrets`` (all failing at ``floor`` when floor > 0, by log(bound /
        target) = ``excess`` when known); returns max hi_j.

        lo_j fails (or is the floor), hi_j passes, and either hi_j <= lo_j (1 + tolerance) or
        hi_j <= max_k lo_k: the returned max_k hi_k is at least the latter, and sigma* > max_k lo_k,
        so a secret passing there needs no sharper bracket. The bound at hi_j becomes its
        certificate.
        """
        # Secrets with the same law (to 1e-10, see envelope_cover), prior and target have the same
        # bracket: each group is bracketed once with its envelope law, which dominates every member.
        every = secrets
        cover = envelope_cover(poisson_binomial(self.groups, every, self.mean), 0.0)
        keys = np.column_stack([cover.row_of, self.priors[every], self.targets[every]])
        _, first, group = np.unique(keys, axis=0, return_index=True, return_inverse=True)
        group = group.ravel()
        secrets = every[first]
        laws = cover.laws.rows(cover.row_of[first])
        self.exact[every] = True
        priors, targets = self.priors[secrets], self.targets[secrets]
        k = secrets.size
        state = _Brackets(k, floor)
        if excess is not None and floor > 0:  # the envelope law dominates: its excess is at least this
            state.f_lo[:] = np.asarray(excess)[first]
        estimate = self.accountant.estimate_sigma(self.mean[secrets], priors, targets, self.steps)
        x = np.maximum(estimate, floor * (1.0 + 4 * self.tolerance))
        x = np.where(x > 0, x, 1.0)
        if excess is not None and floor > 0 and self._slope < 0:  # extrapolate from the floor
            x = floor * np.exp(np.minimum(1.2 * state.f_lo / -self._slope, math.log(4.0)))
            x = np.maximum(x, floor * (1.0 + 2 * self.tolerance))
        probes: list[tuple[int, float]] = [(j, min(float(x[j]), MAX_SIGMA)) for j in range(k)]
        while probes:
            rows = np.array([j for j, _ in probes])
            sigmas = np.array([t for _, t in probes])
            b = self.evaluate(laws.rows(rows), sigmas, priors[rows], np.arange(rows.size), targets[rows])
            state.record(rows, sigmas, np.log(b) - np.log(targets[rows]), b)
            floor = max(floor, float(state.lo.max()))
            closed = (state.hi <= state.lo * (1.0 + self.tolerance)) | (state.hi <= floor)
            open_ = np.flatnonzero(~(np.isfinite(state.hi) & closed))
            probes = [(int(j), t) for j in open_ for t in self._next_probes(state, int(j), floor)]
            # A probe above MAX_SIGMA is tried at MAX_SIGMA unless its bracket already fails there.
            probes = [(j, min(t, MAX_SIGMA)) for j, t in probes if t <= MAX_SIGMA or state.lo[j] < MAX_SIGMA]
            if float(state.lo.max()) >= MAX_SIGMA:
                # Name the secret failing at the largest sigma (issue 22: the first open bracket was
                # named, a feasible secret; issue 29: a bracket whose end lay above the cap left no
                # unmet secret to name and numpy raised "argmax of an empty sequence").
                j = int(np.argmax(state.lo))
                raise ValueError(
                    f"targets[{int(secrets[j])}] = {float(targets[j])!r} cannot be met by the "
                    f"{self.accountant.name!r} accountant at any sigma <= {MAX_SIGMA:g} (its bound "
                    f"still exceeds it at sigma = {float(state.lo[j]):.4g})"
                )
        slopes = state.slopes()
        if slopes.size:
            self._slope = float(np.median(slopes))
        self.bounds[every] = state.bound_hi[group]
        self.certified[every] = True
        self.certified_at[every] = state.hi[group]
        return float(state.hi.max())

    def _next_probes(self, state: _Brackets, j: int, floor: float) -> list[float]:
        """Next sigma(s) to try for bracket j, in log sigma (t). Before a bracket exists: extrapolate
        log(bound/target) linearly through the last two points on the same side, or with the slope
        of the last brackets (step clipped to [x1.05, x4]), else step by 1.5. In a wide bracket:
        Illinois regula falsi, kept off the ends by a third of the tolerance. In a narrow one (at
        most NARROW_BRACKET tolerances), where regula falsi is accurate to far below the tolerance:
        two probes a third of the tolerance either side of its root, which close it at once."""
        lo, hi, f_lo, f_hi = state.lo[j], state.hi[j], state.f_lo[j], state.f_hi[j]
        if not np.isfinite(hi) or lo <= 0:
            t0, f0 = (math.log(hi), f_hi) if lo <= 0 else (math.log(lo), f_lo)
            t1, f1 = state.previous[j] if lo > 0 else (np.nan, np.nan)
            step, smallest = math.log(1.5), math.log(1.05)
            if np.isfinite(t1) and np.isfinite(f1) and f1 > f0 > 0 and t0 > t1:
                step = 1.2 * f0 * (t0 - t1) / (f1 - f0)  # overshoot a little to bracket
            elif self._slope < 0 and np.isfinite(f0):
                step, smallest = 1.2 * abs(f0) / -self._slope, 2 * math.log1p(self.tolerance)
            step = min(max(step, smallest), math.log(4.0))
            t = math.exp(t0 + step) if lo > 0 else math.exp(t0 - step)
            return [t if np.isfinite(hi) else max(t, floor)]
        t_lo, t_hi = math.log(lo), math.log(hi)
        guard = math.log1p(self.tolerance) / 3.0
        if np.isfinite(f_lo) and np.isfinite(f_hi) and f_lo > f_hi:
            t = t_lo + f_lo * (t_hi - t_lo) / (f_lo - f_hi)
        else:
            t = 0.5 * (t_lo + t_hi)
        if t_hi - t_lo <= NARROW_BRACKET * math.log1p(self.tolerance) and np.isfinite(f_lo):
            pair = {min(max(u, t_lo + guard), t_hi - guard) for u in (t - guard, t + guard)}
            return [math.exp(u) for u in sorted(pair)]
        t = min(max(t, t_lo + guard), t_hi - guard)
        return [math.exp(t)]

    # -- step 2: certify many secrets at one sigma -------------------------------------------------

    def _certify_shared(
        self, pending: np.ndarray, sigma: float, refresh: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """Shared truncated-Poisson laws; returns what is still pending and, for it, log(bound/target)
        under the last law tried (+inf where no law applied). ``refresh``: one pass over
        already-certified secrets, keeping the smaller bound."""
        excess = np.full(pending.size, np.inf)
        for ratio in POISSON_RATIOS[:1] if refresh else POISSON_RATIOS:  # refresh: coarse laws, cheap
            if pending.size <= SMALL_PENDING and not refresh:
                break
            cover = poisson_cover(self.rates[pending], self.groups.sizes[pending], ratio)
            if not refresh and cover.laws.num_rows * MIN_SHARING > pending.size:
                continue  # hardly shared: own laws and envelopes certify these for fewer evaluations
            pending, excess, _ = self._apply(pending, cover, sigma, excess, keep_smaller=refresh)
        return pending, excess

    def _certify_own(self, secrets: np.ndarray, sigma: float) -> tuple[np.ndarray, np.ndarray]:
        """Each secret with its own law (identical laws evaluated once); returns the failing ones
        and log(bound / target) for them."""
        if secrets.size == 0:
            return secrets, np.zeros(0)
        cover = envelope_cover(poisson_binomial(self.groups, secrets, self.mean), 0.0)
        self.exact[secrets] = True
        bounds = self.evaluate(cover.laws, sigma, self.priors[secrets], cover.row_of, self.targets[secrets])
        ok = bounds <= self.targets[secrets]
        self._accept(secrets[ok], bounds[ok], sigma)
        fail = ~ok
        return secrets[fail], np.log(bounds[fail]) - np.log(self.targets[secrets[fail]])

    def _certify_envelopes(self, pending: np.ndarray, sigma: float) -> tuple[np.ndarray, np.ndarray]:
        """Envelopes of ever closer groups, then own laws; returns the failures of the last step."""
        if pending.size > SMALL_PENDING:
            laws = poisson_binomial(self.groups, pending, self.mean)
            for resolution in ENVELOPE_RESOLUTIONS:
                cover = envelope_cover(laws, resolution)
                keep, _, still = self._apply(pending, cover, sigma, np.zeros(pending.size))
                laws = laws.rows(np.flatnonzero(still))
                pending = keep
                if pending.size <= SMALL_PENDING:
                    break
        return self._certify_own(pending, sigma)

    def _apply(
        self, pending: np.ndarray, cover: Cover, sigma: float, excess: np.ndarray, keep_smaller: bool = False
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Evaluate a cover at sigma and accept what passes; return what is still pending, its
        log(bound / target) (``excess`` kept where the cover did not apply) and the mask of it."""
        covered = cover.row_of >= 0
        if cover.laws.num_rows == 0 or not covered.any():
            return pending, excess, np.ones(pending.size, dtype=bool)
        members = pending[covered]
        targets = self.targets[members]
        bounds = self.evaluate(cover.laws, sigma, self.priors[members], cover.row_of[covered], targets)
        ok = bounds <= self.targets[members]
        if keep_smaller:
            bounds = np.minimum(bounds, self.bounds[members])
        self._accept(members[ok], bounds[ok], sigma)
        excess = excess.copy()
        excess[covered] = np.log(bounds) - np.log(self.targets[members])
        still = np.ones(pending.size, dtype=bool)
        still[np.flatnonzero(covered)[ok]] = False
        return pending[still], excess[still], still

    def _accept(self, secrets: np.ndarray, bounds: np.ndarray, sigma: float = 0.0) -> None:
        """Record certificates: bounds valid at ``sigma`` and, by monotonicity, at any larger one."""
        self.bounds[secrets] = bounds
        self.certified[secrets] = True
        self.certified_at[secrets] = sigma
