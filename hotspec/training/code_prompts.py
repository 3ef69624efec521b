"""Code prompts for `hotspec distill --code-prompts N`, written from Python source that is not
evaluation data: the documented functions of the Python standard library and of the installed
packages (site-packages, i.e. what PyPI installed: numpy, torch, transformers, ...), or the
folders given.

Each function with a docstring gives a task in one of these forms, in turn:
  * complete: its signature and docstring, the body left out ("Complete the following Python
    function. Reply with the whole function in one Python code block." — the form of
    HumanEval's prompts in benchmarks/humaneval_prompts.py, so a code model's head learns the
    answers it gives there, from other functions);
  * write: "Write a Python function `name(args)`, as this describes it:" and the docstring's
    first paragraph;
  * explain, test, review, type-annotate or port (to JavaScript, TypeScript, Rust, Go, C++) its
    source, one at random.
Complete 4 in 10, write 2, the others 4. Functions are taken in a seeded random order, one task
each, so N prompts cover N functions.
"""

from __future__ import annotations

import ast
import random
import site
import sysconfig
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hotspec.training.conversations import Conversation

COMPLETE = ("Complete the following Python function. Reply with the whole function in one "
            "Python code block.\n\n```python\n{head}```")
WRITE = "Write a Python function `{name}({args})`, as this describes it:\n\n{what}"
ON_SOURCE = (
    "Explain what this Python function does, step by step:\n\n```python\n{src}\n```",
    "Write pytest unit tests for this function, covering its edge cases:\n\n```python\n{src}\n```",
    "Review this Python function: point out bugs or edge cases it misses, then give an improved "
    "version.\n\n```python\n{src}\n```",
    "Add type hints and a concise docstring to this function:\n\n```python\n{src}\n```",
    "Rewrite this Python function in {lang}:\n\n```python\n{src}\n```",
)
LANGS = ("JavaScript", "Rust", "Go", "C++", "TypeScript")
SKIP_DIRS = frozenset({"test", "tests", "idlelib", "lib2to3", "__pycache__", "turtledemo"})


@dataclass(frozen=True)
class Function:
    name: str
    args: str  # the parameter list, as ast.unparse writes it
    head: str  # the def line(s) and the docstring, indented as in the source
    doc: str
    source: str


def default_roots() -> list[Path]:
    """The standard library and every site-packages folder of this interpreter."""
    roots = [Path(sysconfig.get_paths()["stdlib"])]
    roots += [Path(p) for p in (*site.getsitepackages(), site.getusersitepackages())]
    return [r for r in dict.fromkeys(roots) if r.is_dir()]


def _files(roots: list[Path]) -> Iterator[Path]:
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root).parts
            # (the standard library's copy of site-packages is its own root)
            if not SKIP_DIRS & set(rel) and not (len(rel) > 1 and rel[0] == "site-packages"):
                yield path


def functions(roots: list[Path], min_doc: int = 40, max_lines: int = 60) -> list[Function]:
    """Public functions and methods with a docstring of at least `min_doc` characters and at
    most `max_lines` lines of source, from the .py files under `roots` (unreadable or invalid
    files are skipped), distinct by source."""
    out: dict[str, Function] = {}
    for path in _files(roots):
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            continue
        lines = text.splitlines()
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or \
                    node.name.startswith("_") or node.end_lineno is None:
                continue
            doc = ast.get_docstring(node)
            n = node.end_lineno - node.lineno + 1
            if not doc or len(doc) < min_doc or n > max_lines or len(node.body) < 2:
                continue
            first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
            body_start = node.body[1].lineno  # (body[0] is the docstring)
            src = textwrap.dedent("\n".join(lines[first - 1:node.end_lineno]))
            head = textwrap.dedent("\n".join(lines[node.lineno - 1:body_start - 1])) + "\n"
            args = ast.unparse(node.args)
            out.setdefault(src, Function(node.name, args, head, doc, src))
    return list(out.values())


def _what(doc: str) -> str:
    return " ".join(doc.strip().split("\n\n")[0].split())


def code_conversations(funcs: list[Function], n: int, seed: int) -> list[Conversation]:
    """`n` code tasks (fewer if there are fewer functions), one function each, in seeded order."""
    rng = random.Random(seed)
    order = list(funcs)
    rng.shuffle(order)
    out = []
    for i, f in enumerate(order[:n]):
        kind = i % 10  # complete 4 in 10, write 2, a task on the source 4
        if kind < 4:
            text = COMPLETE.format(head=f.head)
        elif kind < 6:
            text = WRITE.format(name=f.name, args=f.args, what=_what(f.doc))
        else:
            text = rng.choice(ON_SOURCE).format(src=f.source, lang=rng.choice(LANGS))
        out.append(Conversation("code", [text]))
    return out
