"""What every experiment writes: ``results.json`` and ``results.md`` (facts, tables, timings, notes).

Secrets are referred to by index only: nothing here receives a secret string.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hush_hf.experiments.logs import Stopwatch, logger

RESULTS_JSON = "results.json"
RESULTS_MARKDOWN = "results.md"
# SecretProtectionConfig fields every experiment records among its choices.
RECORDED_CONFIG_FIELDS = (
    "max_steps",
    "expected_batch_size",
    "per_example_clip_norm",
    "learning_rate",
    "accountant",
    "lp_c",
    "seed",
    "world_size",
)


def json_ready(value: Any) -> Any:
    """``value`` with numpy scalars/arrays, paths and non-finite floats made JSON-safe."""
    import numpy as np

    if isinstance(value, Mapping):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if isinstance(value, np.ndarray):
        return json_ready(value.tolist())
    if isinstance(value, np.generic):
        return json_ready(value.item())
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(json_ready(data), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return path


def fmt(value: Any, spec: str = ".4g") -> str:
    """A table cell: numbers with ``spec``, None as an em dash, the rest as text."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, numbers.Real):
        return "—" if not math.isfinite(value) else format(value, spec)
    return str(value)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def run_choices(args: Any, config: Any, *, leave_out: Sequence[str] = ()) -> dict[str, Any]:
    """The experiment's arguments and the training fields of ``config`` that every results file records."""
    recorded = {k: v for k, v in dataclasses.asdict(args).items() if k not in leave_out}
    return {**recorded, **{name: getattr(config, name) for name in RECORDED_CONFIG_FIELDS}}


def timings_line(timings: Mapping[str, float], cpu: Mapping[str, float]) -> str:
    """``phase wall [CPU]`` for every phase, in seconds (the CPU time is what the work costs here)."""
    cells = [f"{phase} {wall:.0f} [{cpu.get(phase, float('nan')):.0f}]" for phase, wall in timings.items()]
    return "Timings (wall seconds, process CPU seconds in brackets): " + ", ".join(cells) + "."


def results_page(
    title: str,
    facts: Sequence[str],
    sections: Sequence[tuple[str, str]],
    *,
    results: Mapping[str, Any],
    warning: str | None = None,
) -> str:
    """``results.md``: an optional warning, the title, facts (one paragraph each), sections (heading,
    markdown body: tables, figure links), the timings and ``results["notes"]`` as a list."""
    parts = [f"> **WARNING: {warning}**", ""] if warning else []
    parts += [f"# {title}", ""]
    for fact in facts:
        parts += [fact, ""]
    for heading, body in sections:
        parts += ([f"## {heading}", ""] if heading else []) + [body, ""]
    parts += [timings_line(results["timings_seconds"], results["cpu_seconds"]), ""]
    parts += [f"- {note}" for note in results["notes"]]
    return "\n".join(parts) + "\n"


def finish(
    results: dict[str, Any], output_dir: Path, watch: Stopwatch, page: Any, *, main_process: bool
) -> None:
    """Stamp the total times into ``results`` and, on the main process, write ``results.json`` and
    ``results.md`` (``page(results)`` gives its text)."""
    results["timings_seconds"] = {**watch.seconds, "total": watch.total()}
    results["cpu_seconds"] = {**watch.cpu_seconds, "total": watch.total_cpu()}
    if not main_process:
        return
    write_json(output_dir / RESULTS_JSON, results)
    (output_dir / RESULTS_MARKDOWN).write_text(page(results), encoding="utf-8")
    logger.info("Results in %s (%.0f s, CPU %.0f s)", output_dir, watch.total(), watch.total_cpu())


def pivot_table(
    rows: Sequence[Mapping[str, Any]],
    *,
    row: str,
    column: str,
    values: Mapping[str, str],
    row_title: str | None = None,
    row_format: str = "{}",
    header: str = "{title} [{column}]",
) -> str:
    """A markdown table with one line per distinct ``row`` value and, for each ``values`` key (a column
    of the rows, titled by its value), one cell per distinct ``column`` value (first-seen order); cells
    are headed ``header.format(title=..., column=...)``."""
    lines = list(dict.fromkeys(r[row] for r in rows))
    columns = list(dict.fromkeys(r[column] for r in rows))
    cell = {(r[row], r[column]): r for r in rows}
    titles = [row_title or row] + [header.format(title=t, column=c) for t in values.values() for c in columns]
    body = [
        [row_format.format(line)] + [cell.get((line, c), {}).get(key) for key in values for c in columns]
        for line in lines
    ]
    return markdown_table(titles, body)


def secret_rows(
    plan: Any, sensitive: set[int], attacks: Mapping[str, Any], *, names: Sequence[str] | None = None,
    fingerprints: Sequence[str] | None = None, name_key: str = "name",
) -> list[dict[str, Any]]:
    """One row per secret of ``plan``: its index (and keyed fingerprint, and name under ``name_key``, only
    when given: a name is the secret),
    whether it is ``sensitive``, its examples, sum of rho, prior, target and certified bound, and per
    attack (``attacks[method]["per_secret"][j]``) its rank and posterior."""
    rows = []
    for j in range(plan.num_secrets):
        row: dict[str, Any] = {"secret": j}
        if fingerprints is not None:
            row["fingerprint"] = fingerprints[j]
        if names is not None:
            row[name_key] = names[j]
        found = plan.secrets
        row.update(sensitive=j in sensitive, examples=int(found.num_examples[j]),
                   sum_rho=float(found.sum_rho[j]))
        row.update({key: float(getattr(found, key)[j]) for key in ("prior", "target", "bound")})
        for method, found in attacks.items():
            hit = found["per_secret"].get(j)
            row[f"rank_{method}"] = None if hit is None else hit["rank"]
            row[f"posterior_{method}"] = None if hit is None else hit["probability"]
        rows.append(row)
    return rows

