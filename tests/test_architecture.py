"""The layout's promises (docs/architecture.md): no import cycles, the data plane never depends on the
control plane, the operator never on the CLI, generation never on the simulator, an operator
install that needs neither torch nor transformers, and a generation job (the Ray worker image's) that needs no torch."""

from __future__ import annotations

import ast
import importlib.metadata as md
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"eyrie.jobs": ROOT / "jobs", "eyrie.operator": ROOT / "operator"}


def _modules() -> dict[str, Path]:
    out = {}
    for name, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("").parts
            mod = ".".join((name, *rel))
            out[mod.removesuffix(".__init__")] = path
    return out


def _imports(mod: str, path: Path, known: set[str]) -> set[str]:
    """Every eyrie module `mod` imports, at module level or inside a function (but not for typing)."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING"
                   for n in ast.walk(node)}
    pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(pkg.split(".")[: len(pkg.split(".")) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for n in names:
            while n and n not in known:
                n = n.rpartition(".")[0]
            if n and n != mod:
                found.add(n)
    return found


def graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(m, p, set(mods)) for m, p in mods.items()}


def _cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in g:
        if v not in index:
            visit(v)
    return out


def test_the_graph_is_read_from_the_tree():
    g = graph()
    assert "eyrie.jobs.generate.driver" in g["eyrie.jobs.pipeline"]
    assert "eyrie.jobs.contract.progress" in g["eyrie.operator.handlers"]


def test_no_import_cycles():
    assert _cycles(graph()) == []


def test_a_cycle_would_be_found():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _edges(g: dict[str, set[str]], src: str, dst: str) -> list[tuple[str, str]]:
    return sorted((a, b) for a, bs in g.items() if a.startswith(src) for b in bs if b.startswith(dst))


def test_the_data_plane_never_imports_the_operator():
    assert _edges(graph(), "eyrie.jobs", "eyrie.operator") == []


def test_the_operator_never_imports_the_cli():
    assert _edges(graph(), "eyrie.operator", "eyrie.jobs.cli") == []


def test_generation_never_imports_the_simulator():
    g = graph()
    assert _edges(g, "eyrie.jobs.generate", "eyrie.jobs.simulator") == []
    assert _edges(g, "eyrie.jobs.generate", "eyrie.jobs.simulator.text") == []


def _eyrie_requires() -> list[str]:
    """eyrie's own requirements as pyproject.toml declares them (an installed copy of its metadata may be stale: an
    old eyrie.egg-info in a working tree shadows the venv's)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *(f"{r}; extra == {extra!r}" if ";" not in r else
                                        f"{r.split(';')[0]}; ({r.split(';', 1)[1].strip()}) and extra == {extra!r}"
                                        for extra, reqs in project["optional-dependencies"].items() for r in reqs)]


def _closure(extras: set[str]) -> set[str]:
    """Every distribution `eyrie[extras]` requires, transitively: eyrie's from pyproject.toml, the rest from the
    installed metadata."""
    seen: set[str] = set()
    todo = [("eyrie", frozenset(extras))]
    while todo:
        dist, want = todo.pop()
        for line in (_eyrie_requires() if dist == "eyrie" else md.requires(dist)) or ():
            req = Requirement(line)
            if req.marker and not any(req.marker.evaluate({"extra": e}) for e in (want or {""})):
                continue
            name = re.sub(r"[-_.]+", "-", req.name).lower()
            if name == "eyrie":
                todo.append(("eyrie", frozenset(req.extras)))
            elif name not in seen:
                seen.add(name)
                try:
                    md.distribution(name)
                except md.PackageNotFoundError:
                    continue  # not installed here: its own requirements cannot be read
                todo.append((name, frozenset(req.extras)))
    return seen


def test_the_operator_extra_requires_neither_torch_nor_transformers():
    operator = _closure({"operator"})
    assert {"kopf", "kubernetes-asyncio"} <= operator
    assert not {"torch", "transformers", "safetensors"} & operator
    assert {"torch", "transformers"} <= _closure({"jobs"})  # the data plane does need them


def test_the_generate_extra_is_the_data_plane_without_torch():
    generate, jobs = _closure({"generate"}), _closure({"jobs"})
    assert {"ray", "httpx", "transformers", "tokenizers", "pyarrow"} <= generate < jobs
    assert not {"torch", "triton"} & generate and not [d for d in generate if d.startswith(("nvidia-", "cuda-"))]


# An import system that cannot find torch (as in the Ray worker image, where it is not installed):
# every finder is wrapped, so importlib.util.find_spec answers None too (what transformers asks before importing).
HIDE_TORCH = """
import sys
class Hide:
    def __init__(self, inner): self.inner = inner
    def __getattr__(self, name): return getattr(self.inner, name)  # find_distributions: metadata stays readable
    def find_spec(self, name, path=None, target=None):
        if name.partition('.')[0] in ('torch', 'triton'): return None
        return self.inner.find_spec(name, path, target)
sys.meta_path[:] = [Hide(f) if hasattr(f, 'find_spec') else f for f in sys.meta_path]
"""


@pytest.mark.integration
def test_the_generation_job_runs_where_torch_cannot_be_found(tmp_path):
    """What a RayJob's head runs (`eyrie run SPEC --until samples`): generation and reconstruction, end to end on
    the simulator with the bundled tokenizer, with torch out of the import system's reach."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"Say {i}."}]}) + "\n"
                               for i in range(6)))
    out = tmp_path / "out"
    spec = {"sources": [{"name": "p", "uri": str(prompts), "format": "openai"}],
            "target": {"model": "sim/model", "tokenizer": "bundled:deepseek-v4", "chatFormat": "deepseek-v4"},
            "api": {"baseUrl": "simulated", "maxConcurrency": 4},
            "tools": {"gate": {"canarySamples": 2, "minToolCallRate": 0.0}},
            "budget": {"maxUSD": "1", "pricing": {"inputPerMillion": "0.6", "outputPerMillion": "2.5"}},
            "generation": {"shards": 2}, "extraction": {"enabled": False}, "output": {"uri": f"file://{out}"}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    code = HIDE_TORCH + (
        "import importlib.util\n"
        "assert importlib.util.find_spec('torch') is None\n"
        "from eyrie.jobs.cli import main\n"
        f"main(['run', {str(path)!r}, '--no-progress', '--inline', '--until', 'samples'])\n"
        "")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "torch" not in r.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["reconstruction"]["samples"]["kept"] == 6, manifest["reconstruction"]["samples"]


@pytest.mark.integration
def test_eyrie_operator_runs_where_torch_and_transformers_cannot_be_imported():
    code = ("import sys\n"
            "for m in ('torch', 'transformers', 'safetensors', 'tokenizers'): sys.modules[m] = None\n"
            "from eyrie.jobs.cli import main\n"
            "main(['operator', '--help'])\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "--namespace" in r.stdout


def test_every_package_folder_is_in_the_wheel():
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join((name, *init.parent.relative_to(folder).parts)).rstrip(".")
             for name, folder in PACKAGES.items() for init in folder.rglob("__init__.py")}
    assert found == listed
