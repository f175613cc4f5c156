"""Every fenced code block in README.md and docs/*.md runs as written.

Each document runs in a fresh temporary folder (the current directory while it runs), its blocks in
order; the Python blocks of one document share one namespace, so a block may use what an earlier block
of the same document defined. How a block runs, by its language:

- ``python``: executed.
- ``bash``: command by command (backslash continuations joined, ``#`` comments dropped). ``hush ...``
  runs through the CLI entry point (pyproject's ``hush = "hush_hf.cli:main"``, called in-process) and
  must exit 0; ``python ...`` runs in a subprocess from the repository root. Any other command
  (``make``, ``accelerate``, ...) must have an entry in ``SUBSTITUTIONS``: nothing is skipped silently.
- ``csv`` / ``json``: parsed, then written to the file that the line before the block names
  (``secrets.csv``:), so that later blocks read it; without such a line, only parsed.
- ``diff``: README's diff patches transformers' ``examples/pytorch/language-modeling/run_clm.py``, which
  no installed package ships, so applying it cannot be checked offline. Instead, every added line must
  compile (a line that opens a call, ``trainer = SecretProtectionTrainer(``, is closed first) and every
  added import must run.
- any other language: a failure (give it a runner here).

Every block runs exactly as a reader copies it: nothing in a block's text is replaced or added.
``PRELUDES``: per document, the inputs a reader brings (a model, a tokenizer, a tokenized dataset, a
secrets file, data files), small and offline; a prelude brings inputs only, never code the blocks run.
``SUBSTITUTIONS``: the few whole bash commands the suite cannot run (one that trains for minutes or
hours, needs several processes or GPUs, or is the test suite itself) are checked instead (a dry run of
the make target, the accelerate config and script); each entry says why, and an entry that matches no
command fails the suite (``test_every_substitution_is_used``). ``test_runner_fails_on_a_broken_block``
shows that a broken block fails, ``test_blocks_run_as_written`` that the runner runs the text as is.
"""

from __future__ import annotations

import ast
import contextlib
import csv
import io
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.test_trainer_helpers import single_thread  # noqa: F401  (autouse fixture)

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]

pytestmark = pytest.mark.filterwarnings(
    "ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning"
)


# ------------------------------------------------------------------------------------------ blocks
@dataclass(frozen=True)
class Block:
    document: str
    line: int  # of the opening fence, 1-based
    language: str
    source: str
    file_name: str | None  # from a line "`name.ext`:" just before the block

    @property
    def where(self) -> str:
        return f"{self.document}:{self.line} ({self.language} block)"


FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
FILE_LINE = re.compile(r"^`([\w./-]+)`:\s*$")


def code_blocks(text: str, document: str) -> list[Block]:
    """The fenced blocks of a Markdown text, in order (indentation of the fence removed)."""
    blocks, lines, k = [], text.splitlines(), 0
    while k < len(lines):
        opening = FENCE.match(lines[k])
        if not opening:
            k += 1
            continue
        indent, fence, language = opening.groups()
        end = k + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        if end == len(lines):
            raise AssertionError(f"{document}:{k + 1}: code block is never closed")
        body = [line[len(indent):] if line.startswith(indent) else line for line in lines[k + 1 : end]]
        previous = next((lines[j].strip() for j in range(k - 1, -1, -1) if lines[j].strip()), "")
        named = FILE_LINE.match(previous)
        blocks.append(Block(document, k + 1, language.lower(), "\n".join(body) + "\n",
                            named.group(1) if named else None))  # fmt: skip
        k = end + 1
    return blocks


def shell_commands(source: str) -> list[str]:
    """The commands of a bash block: continuations joined, comments and blank lines dropped."""
    commands, pending = [], ""
    for line in source.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        words = shlex.split(pending + line, comments=True)
        pending = ""
        if words:
            commands.append(shlex.join(words))
    return commands


# ------------------------------------------------------------------------------------------ substitutions
@dataclass(frozen=True)
class Substitution:
    """``original``: a whole bash command (as ``shell_commands`` gives it) that the suite cannot run.
    ``instead``: a cheaper check of it (a dry-run command, or a function of the document's folder)."""

    original: str
    instead: str | Callable[[Path], None]
    reason: str


def accelerate_launch_is_ready(config: str, script: str) -> Callable[[Path], None]:
    def check(_: Path) -> None:
        from accelerate.commands.config.config_args import load_config_from_file

        assert (ROOT / config).is_file(), f"{config} does not exist"
        load_config_from_file(str(ROOT / config))
        compile((ROOT / script).read_text(), script, "exec")

    check.__doc__ = f"{config} loads as an accelerate config and {script} compiles"
    return check


SUBSTITUTIONS = [
    Substitution("make demo", "make -n demo",
                 "the demo trains and audits 12 models (~10 min); the dry run checks the target and its "
                 "command; the recipe's smoke run under accelerate is tests/test_recipes.py"),
    Substitution("make test", "make -n test", "it is the test suite this test belongs to"),
    Substitution("make test-slow", "make -n test-slow", "the slow suite takes hours on 2 CPU cores"),
    Substitution("make bench", "make -n bench", "the benchmark takes minutes (docs/benchmarks.md)"),
    Substitution(
        "accelerate launch --config_file configs/accelerate/cpu_2proc.yaml recipes/arxiv_mlm.py",
        accelerate_launch_is_ready("configs/accelerate/cpu_2proc.yaml", "recipes/arxiv_mlm.py"),
        "a 2-process run of the demo (~11 min); 2-process smoke runs are tests/test_recipes.py and "
        "tests/test_distributed.py",
    ),
    Substitution(
        "accelerate launch --config_file configs/accelerate/multi_gpu.yaml recipes/arxiv_mlm.py",
        accelerate_launch_is_ready("configs/accelerate/multi_gpu.yaml", "recipes/arxiv_mlm.py"),
        "needs several GPUs",
    ),
    Substitution(
        "accelerate launch --config_file configs/accelerate/fsdp.yaml recipes/gemma2_pretrain.py",
        accelerate_launch_is_ready("configs/accelerate/fsdp.yaml", "recipes/gemma2_pretrain.py"),
        "needs several GPUs; FSDP2 steps on CPU processes are tests/test_fsdp_steps.py",
    ),
]


# ------------------------------------------------------------------------------------------ preludes
#: The reader's secrets file: README's own ``secrets.csv`` example (a later block writes it again).
README_SECRETS = "id,prior,target,terms\nproject-falcon,1e-6,1e-3,falcon;project falcon\n"
TRL_SECRETS = README_SECRETS + "lab-code,1e-6,1e-3,zebra\n"


FILLER = ["budget", "meeting", "review", "lunch", "travel", "report", "design", "hiring"]


def text_rows(n: int, seed: int = 0) -> list[str]:
    rows = []
    for i in range(n):
        words = [FILLER[(i * 3 + k + seed) % len(FILLER)] for k in range(4)]
        secret = " about project falcon" if i % 4 == 0 else " with the code zebra" if i % 5 == 0 else ""
        rows.append(f"note {i + seed}: the {words[0]} and {words[1]} moved{secret}; {words[2]} {words[3]}.")
    return rows


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def tiny_gpt2(vocab: int):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_embd=16, n_layer=2, n_head=2, n_positions=128))


def gpt2_tokenizer():
    from hush_hf.assets import gpt2_tokenizer as offline_gpt2

    tokenizer = offline_gpt2()
    tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def readme_prelude(folder: Path) -> dict[str, Any]:
    """secrets.csv, data.jsonl (48 rows, = train.jsonl), heldout.jsonl, canaries.json; ``model`` (a tiny
    GPT-2), ``tokenizer`` (GPT-2's, offline), ``tokenized`` (data.jsonl through the marking tokenizer, as
    in "Existing scripts") and ``collator`` (causal LM)."""
    import datasets
    from transformers import DataCollatorForLanguageModeling

    from hush_hf import mark_secrets
    from hush_hf.audit.canaries import CanarySpace, make_canaries, save_canaries

    (folder / "secrets.csv").write_text(README_SECRETS)
    texts = text_rows(48)
    write_jsonl(folder / "data.jsonl", [{"text": t} for t in texts])
    write_jsonl(folder / "train.jsonl", [{"text": t} for t in texts])
    write_jsonl(folder / "heldout.jsonl", [{"text": t} for t in text_rows(16, seed=100)])
    save_canaries(folder / "canaries.json", make_canaries(2, space=CanarySpace(length=3), seed=0))
    tokenizer = gpt2_tokenizer()
    marking = mark_secrets(tokenizer, "secrets.csv")
    data = datasets.Dataset.from_dict({"text": texts})
    tokenized = data.map(lambda batch: marking(batch["text"]), batched=True, remove_columns=["text"])
    return {
        "model": tiny_gpt2(len(tokenizer)),
        "tokenizer": tokenizer,
        "tokenized": tokenized,
        "collator": DataCollatorForLanguageModeling(tokenizer, mlm=False),
    }


def trl_prelude(folder: Path) -> dict[str, Any]:
    """secrets.csv, chats.jsonl (64 prompt/completion rows, 24 of them holding a secret); ``model`` (a
    tiny GPT-2) and ``tokenizer``."""
    (folder / "secrets.csv").write_text(TRL_SECRETS)
    prompts = ["our project is called", "lunch today is", "the lab code is", "the meeting moved to"] * 2
    completions = [" falcon", " pasta", " zebra", " friday", " project falcon", " soup", " unknown", " noon"]
    rows = [
        {"prompt": f"note {k}: {p}", "completion": c}
        for k in range(8)
        for p, c in zip(prompts, completions, strict=True)
    ]
    write_jsonl(folder / "chats.jsonl", rows)
    tokenizer = gpt2_tokenizer()
    return {"model": tiny_gpt2(len(tokenizer)), "tokenizer": tokenizer}


PRELUDES: dict[str, Callable[[Path], dict[str, Any]]] = {
    "README.md": readme_prelude,
    "docs/trl.md": trl_prelude,
}


# ------------------------------------------------------------------------------------------ the runner
class BlockFailed(AssertionError):
    pass


def hush_entry_point() -> Callable[[list[str]], int]:
    """What the installed ``hush`` command calls (pyproject's [project.scripts])."""
    from importlib.metadata import entry_points

    (script,) = entry_points(group="console_scripts", name="hush")
    return script.load()


def run_command(command: str, folder: Path) -> None:
    """One bash command as the runner knows it (see the module docstring); raises on failure."""
    sub = next((s for s in SUBSTITUTIONS if s.original == command), None)
    if sub is not None and callable(sub.instead):
        sub.instead(folder)
        return
    command = sub.instead if sub is not None else command
    words = shlex.split(command)
    if words[0] == "hush":
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = hush_entry_point()(words[1:])
        if status != 0:
            said = err.getvalue()[-2000:] + out.getvalue()[-2000:]
            raise BlockFailed(f"`{command}` exited {status}: {said}")
        return
    if words[0] in ("make", "python"):
        argv = ["make", "-C", str(ROOT), *words[1:]] if words[0] == "make" else [sys.executable, *words[1:]]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise BlockFailed(f"`{command}` exited {done.returncode}: {(done.stderr + done.stdout)[-2000:]}")
        return
    raise BlockFailed(f"no runner for `{command}`: add a Substitution for it (with its reason)")


def check_diff(block: Block, namespace: dict[str, Any]) -> None:
    added = [line[1:] for line in block.source.splitlines() if line.startswith("+")]
    assert added, f"{block.where}: a diff that adds nothing"
    for line in added:
        code = line.strip()
        opened = sum(code.count(c) for c in "([{") - sum(code.count(c) for c in ")]}")
        closed = code + ")" * max(opened, 0)
        try:
            tree = ast.parse(closed)
        except SyntaxError as error:
            raise BlockFailed(f"{block.where}: added line does not compile: {line!r} ({error.msg})") from None
        if isinstance(tree.body[0], (ast.Import, ast.ImportFrom)):
            exec(compile(tree, block.where, "exec"), namespace)


def run_block(block: Block, folder: Path, namespace: dict[str, Any]) -> None:
    language, source = block.language, block.source
    try:
        if language == "python":
            exec(compile(source, block.where, "exec"), namespace)
        elif language in ("bash", "sh", "shell"):
            for command in shell_commands(source):
                run_command(command, folder)
        elif language in ("csv", "json"):
            if language == "json":
                json.loads(source)
            else:
                rows = list(csv.reader(io.StringIO(source)))
                assert rows and all(len(row) == len(rows[0]) for row in rows), "rows of unequal length"
            if block.file_name is not None:
                (folder / block.file_name).write_text(source)
        elif language == "diff":
            check_diff(block, namespace)
        else:
            raise BlockFailed(f"no runner for a {language or 'unlabelled'} block: label it or add a runner")
    except BlockFailed as error:
        raise BlockFailed(f"{block.where}: {error}") from None
    except Exception as error:
        raise BlockFailed(f"{block.where} failed: {type(error).__name__}: {error}") from error


def run_document(path: Path, folder: Path, prelude: Callable[[Path], dict[str, Any]] | None) -> int:
    """Run every block of ``path`` in ``folder`` (the current directory meanwhile); the number run."""
    name = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name
    blocks = code_blocks(path.read_text(), name)
    previous = Path.cwd()
    os.chdir(folder)
    try:
        namespace: dict[str, Any] = {"__name__": "__docs__"}
        if prelude is not None:
            namespace.update(prelude(folder))
        for block in blocks:
            run_block(block, folder, namespace)
    finally:
        os.chdir(previous)
    return len(blocks)


# ------------------------------------------------------------------------------------------ tests
@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_code_block_runs(document, tmp_path, monkeypatch):
    import datasets
    import huggingface_hub

    # Offline: a block naming data that is not there must fail at once, not retry the Hub for 20 s.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets-cache"))
    run_document(ROOT / document, tmp_path, PRELUDES.get(document))


def test_every_substitution_is_used():
    blocks = [b for d in DOCUMENTS for b in code_blocks((ROOT / d).read_text(), d)]
    commands = {c for b in blocks if b.language == "bash" for c in shell_commands(b.source)}
    for sub in SUBSTITUTIONS:
        assert sub.original in commands, f"substitution for {sub.original!r} matches no command: remove it"


BROKEN = '''# A document

```python
x = 1
```

`numbers.csv`:
```csv
a,b
1,2
```

```python
assert open("numbers.csv").read().startswith("a,b")
y = x + undefined_name
```
'''


def test_runner_fails_on_a_broken_block(tmp_path):
    doc = tmp_path / "broken.md"
    doc.write_text(BROKEN)
    with pytest.raises(BlockFailed, match=r"broken.md:13 \(python block\) failed: NameError: .*undefined"):
        run_document(doc, tmp_path, None)
    doc.write_text(BROKEN.replace("undefined_name", "1"))
    assert run_document(doc, tmp_path, None) == 3

    cases = [
        ("bash", "hush verify no-such-dir", r"broken.md:1 \(bash block\): `hush verify no-such-dir` exited"),
        ("bash", "curl https://x.invalid \\\n  -o x", r"no runner for `curl https://x\.invalid -o x`"),
        ("bash", "python -c 'raise SystemExit(3)'", r"`python -c 'raise SystemExit\(3\)'` exited 3"),
        ("diff", "+from hush_hf import NoSuchName", r"ImportError: cannot import name 'NoSuchName'"),
        ("diff", "+    trainer = Trainer(,", r"added line does not compile"),
        ("json", '{"a": 1,}', r"JSONDecodeError"),
        ("", "some text", r"no runner for a unlabelled block"),
    ]
    for language, body, match in cases:
        doc.write_text(f"```{language}\n{body}\n```\n")
        with pytest.raises(BlockFailed, match=match):
            run_document(doc, tmp_path, None)


def test_blocks_run_as_written(tmp_path):
    """The runner runs a block's text as it stands: numbers a real run would take (T = 2000 steps,
    B = 2048) are not scaled down, and nothing is added (no CPU switch)."""
    doc = tmp_path / "as_written.md"
    block = "T, B = 2000, 256\nargs = dict(\n    max_steps=2000,\n    max_steps_again=T,\n"
    block += "    expected_batch_size=2048)\n"
    doc.write_text(f"```python\n{block}open('seen.txt', 'w').write(repr(args))\n```\n")
    run_document(doc, tmp_path, None)
    expected = {"max_steps": 2000, "max_steps_again": 2000, "expected_batch_size": 2048}
    assert (tmp_path / "seen.txt").read_text() == repr(expected)


def test_blocks_and_commands_are_read_as_a_reader_reads_them():
    text = (
        "intro\n\n`a.csv`:\n```csv\nx\n```\n"
        "  ```bash\n  hush plan --x 1 \\\n      --y 2   # comment\n\n  make test\n  ```\n"
    )
    first, second = code_blocks(text, "t.md")
    assert (first.language, first.file_name, first.source, first.line) == ("csv", "a.csv", "x\n", 4)
    assert second.file_name is None
    assert shell_commands(second.source) == ["hush plan --x 1 --y 2", "make test"]
