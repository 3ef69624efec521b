"""`hotspec distill --code-prompts`: code tasks written from documented library functions."""

from __future__ import annotations

from pathlib import Path

from hotspec.training.code_prompts import code_conversations, functions

MODULE = '''
import functools


def moving_average(values: list[float], window: int = 3) -> list[float]:
    """Return the moving averages of `values` over windows of `window` items, one per full
    window, in order."""
    out = []
    for i in range(len(values) - window + 1):
        out.append(sum(values[i:i + window]) / window)
    return out


class Stack:
    @functools.lru_cache
    def peek_all(self, depth):
        """Every item down to `depth`, the top first; an empty list for an empty stack."""
        items = list(self.items)
        return items[::-1][:depth]

    def _private(self):
        """A private helper is no task, whatever its docstring says about itself."""
        return 1


def undocumented(x):
    y = x + 1
    return y


def short(x):
    """Too short."""
    return x
'''


def _tree(tmp_path: Path) -> Path:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(MODULE)
    (tmp_path / "pkg" / "broken.py").write_text("def f(:\n")  # not Python: skipped
    (tmp_path / "pkg" / "tests").mkdir()
    (tmp_path / "pkg" / "tests" / "test_mod.py").write_text(MODULE.replace("moving", "other"))
    return tmp_path


def test_documented_public_functions_become_tasks(tmp_path):
    funcs = functions([_tree(tmp_path)])
    assert sorted(f.name for f in funcs) == ["moving_average", "peek_all"]  # (tests/ skipped)
    f = next(f for f in funcs if f.name == "moving_average")
    assert f.head.startswith("def moving_average(values: list[float], window: int = 3)")
    assert f.head.rstrip().endswith('in order."""') and "out = []" not in f.head
    assert f.source.endswith("return out") and f.args == "values: list[float], window: int=3"
    method = next(f for f in funcs if f.name == "peek_all")
    assert method.source.startswith("@functools.lru_cache\ndef peek_all")  # dedented


def test_code_conversations_cover_every_form_once_per_function(tmp_path):
    funcs = functions([_tree(tmp_path)])  # two functions: two tasks at most
    assert len(code_conversations(funcs, 5, seed=0)) == 2
    many = [f.__class__(f"{f.name}{i}", f.args, f.head.replace(f.name, f"{f.name}{i}"), f.doc,
                        f.source.replace(f.name, f"{f.name}{i}")) for i in range(20) for f in funcs]
    convs = code_conversations(many, 30, seed=1)
    texts = [c.users[0] for c in convs]
    assert len(texts) == 30 == len(set(texts)) and {c.source for c in convs} == {"code"}
    complete = [t for t in texts if t.startswith("Complete the following Python function")]
    write = [t for t in texts if t.startswith("Write a Python function `")]
    assert len(complete) == 12 and len(write) == 6
    assert all("```python\ndef " in t or "```python\n@functools" in t for t in complete)
    assert all(t.endswith(("one per full window, in order.", "the top first; an empty list for "
                           "an empty stack.")) for t in write)
    assert code_conversations(many, 30, seed=1)[5].users == convs[5].users  # seeded


def test_distill_answers_code_prompts(tmp_path, capsys):
    """`hotspec distill --code-prompts N --code-roots DIR`: the target answers the tasks; a folder
    that is not there is a clear error."""
    from hotspec.cli.main import main as cli_main
    from hotspec.training.token_shards import load_records

    root = _tree(tmp_path)

    def args(out: str, code_root: str) -> list[str]:
        return ["distill", "--out", out, "--no-sharegpt", "--code-prompts", "5", "--code-roots",
                code_root, "--max-new-tokens", "4", "--device", "cpu", "--dtype", "float32",
                "--no-progress"]

    assert cli_main(args(str(tmp_path / "data"), str(root))) == 0
    assert load_records(tmp_path / "data").num_records == 2  # one task per public function
    assert cli_main(args(str(tmp_path / "other"), str(tmp_path / "nope"))) == 2
    assert "--code-roots: no such folder" in capsys.readouterr().err
