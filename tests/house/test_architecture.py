"""The layout's promises (docs/architecture.md): the layer order (no import runs upward, inside a function or under
TYPE_CHECKING included), no import cycles, the data plane never depends on the control plane, the operator never on
the CLI, generation never on the simulator, an operator install that needs neither torch nor transformers, and a
generation job (the Ray worker image's) that needs no torch."""

from __future__ import annotations

import ast
import functools
import importlib.metadata as md
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
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
    """Every eyrie module `mod` imports, at module level, inside a function or under TYPE_CHECKING: an import
    for typing only is still a dependency (a cycle hidden behind TYPE_CHECKING is a cycle)."""
    tree = ast.parse(path.read_text())
    pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
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


@functools.cache
def graph() -> dict[str, set[str]]:
    """The import graph (read once per process: the tests below only read it)."""
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


def test_a_typing_only_import_is_an_edge(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from eyrie.jobs.b import B\n")
    assert _imports("eyrie.jobs.m", path, {"eyrie.jobs.m", "eyrie.jobs.b"}) == {"eyrie.jobs.b"}


# The layer order (docs/architecture.md, "Layers"), lowest first, as kopf's import contract states its own: a module
# imports only from its own package or from a lower layer, at module level, inside a function or under TYPE_CHECKING
# alike (an import made lazy for start-up cost or an optional dependency still points the same way). The packages
# of one layer are independent of each other. Every module of eyrie is in exactly one layer: a new top-level module
# or package is placed here, in the same change.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("eyrie.jobs.errors",),  # the one root of eyrie's exceptions
    ("eyrie.jobs.jsonvalues", "eyrie.jobs.intervals", "eyrie.jobs.cache", "eyrie.jobs.context", "eyrie.jobs.model",
     "eyrie.jobs.timeline"),
    ("eyrie.jobs.store", "eyrie.jobs.status"),
    ("eyrie.jobs.spec",),
    ("eyrie.jobs.contract",),  # store keys, records, progress.json, the manifest, prompts, layer conventions
    ("eyrie.jobs.shipped",),  # the builtin models' shipped files (the tokenizer loader reads them)
    ("eyrie.jobs.api",),  # the HTTP client
    ("eyrie.jobs.reconstruct",),  # chat formats, tokenizers, template variants: stage 2, and the canary's
    ("eyrie.jobs.tools",),
    ("eyrie.jobs.sources",),
    ("eyrie.jobs.generate",),  # stage 1
    ("eyrie.jobs.extract",),  # stage 3
    ("eyrie.jobs.evaluate",),
    ("eyrie.jobs.report",),
    ("eyrie.jobs.pilot",),  # the pilot stage: buys (generate), extracts, evaluates; pipeline and the CLI run it
    ("eyrie.jobs.simulator",),  # a provider for demos and tests: only pipeline and the CLI start it
    ("eyrie.jobs.pipeline",),
    ("eyrie.jobs.crd",),  # the CRD generated from the spec model (`eyrie crd`, hack/derived.py)
    ("eyrie.jobs.cli",),
    ("eyrie.operator",),
)
ROOTS = ("eyrie.jobs",)  # the packages' own __init__ (empty): below everything


def layer_of(mod: str, layers: tuple[tuple[str, ...], ...] = LAYERS) -> tuple[int, str] | None:
    """(layer index, the package it is in) for a module, by its longest listed prefix; None when unplaced."""
    best = None
    for i, names in enumerate(layers):
        for name in names:
            if (mod == name or mod.startswith(name + ".")) and (best is None or len(name) > len(best[1])):
                best = (i, name)
    return best


def layering_violations(g: dict[str, set[str]], layers: tuple[tuple[str, ...], ...] = LAYERS) -> list[str]:
    """Every import that runs upward or sideways (between two packages of one layer), and every unplaced module."""
    out = []
    for mod in sorted(g):
        if mod in ROOTS:
            continue
        here = layer_of(mod, layers)
        if here is None:
            out.append(f"{mod} is in no layer")
            continue
        for dep in sorted(g[mod]):
            there = layer_of(dep, layers)
            if dep in ROOTS or there is None or there[1] == here[1]:
                continue
            if there[0] > here[0]:
                out.append(f"{mod} imports {dep}: up from {here[1]} to {there[1]}")
            elif there[0] == here[0]:
                out.append(f"{mod} imports {dep}: sideways within one layer ({here[1]}, {there[1]})")
    return out


def test_no_import_runs_against_the_layer_order():
    assert layering_violations(graph()) == []


def test_an_upward_import_would_be_found(tmp_path):
    layers = (("eyrie.jobs.store",), ("eyrie.jobs.generate", "eyrie.jobs.extract"), ("eyrie.jobs.cli",))
    path = tmp_path / "m.py"
    path.write_text("def f():\n    from eyrie.jobs.cli import main  # lazy: still an edge\n")
    mods = {"eyrie.jobs.generate.m", "eyrie.jobs.cli", "eyrie.jobs.store", "eyrie.jobs.extract.x"}
    assert _imports("eyrie.jobs.generate.m", path, mods) == {"eyrie.jobs.cli"}
    g = {"eyrie.jobs.generate.m": {"eyrie.jobs.cli", "eyrie.jobs.store", "eyrie.jobs.extract.x"},
         "eyrie.jobs.cli": {"eyrie.jobs.generate.m"}, "eyrie.jobs.store": set(), "eyrie.jobs.extract.x": set(),
         "eyrie.jobs.newthing": set()}
    assert layering_violations(g, layers) == [
        "eyrie.jobs.generate.m imports eyrie.jobs.cli: up from eyrie.jobs.generate to eyrie.jobs.cli",
        "eyrie.jobs.generate.m imports eyrie.jobs.extract.x: sideways within one layer (eyrie.jobs.generate, "
        "eyrie.jobs.extract)",
        "eyrie.jobs.newthing is in no layer"]


def test_every_layer_names_a_module_that_exists():
    mods = set(_modules())
    assert [n for names in LAYERS for n in names if n not in mods] == []


@functools.cache
def _trees() -> dict[str, ast.AST]:
    return {m: ast.parse(p.read_text()) for m, p in _modules().items()}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_defined(tree: ast.AST) -> set[str]:
    """The underscore names a module defines: functions, classes, variables, attributes it assigns, parameters."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.add(n.id)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
            out.add(n.attr)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
    return {d for d in out if _private(d)}


def private_uses(trees: dict[str, ast.AST]) -> list[str]:
    """Every use in one eyrie module of another's underscore-private name: `from other import _name`, or
    `x._name` where `_name` is defined by another eyrie module and not by this one (`self._x`, `cls._x` and
    `super()._x` are the module's own). A name several modules define is read as the using module's own."""
    defined = {m: _private_defined(t) for m, t in trees.items()}
    elsewhere = set().union(*defined.values()) if defined else set()
    found = []
    for mod, tree in trees.items():
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("eyrie"):
                found += [f"{mod}:{n.lineno} imports {n.module}.{a.name}" for a in n.names if _private(a.name)]
            elif isinstance(n, ast.Attribute) and _private(n.attr) and n.attr not in defined[mod]:
                own = (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls")) or (
                    isinstance(n.value, ast.Call) and getattr(n.value.func, "id", "") == "super")
                if not own and n.attr in elsewhere:
                    found.append(f"{mod}:{n.lineno} reads {ast.unparse(n)}")
    return found


def test_no_module_uses_another_modules_private_names():
    assert private_uses(_trees()) == []


def test_a_private_use_would_be_found():
    trees = {"a": ast.parse("def _helper(): pass\nclass A:\n    def __init__(self): self._x = 1\n"),
             "b": ast.parse("from eyrie.jobs.a import _helper\n"),
             "c": ast.parse("def f(a): return a._x\n"),
             "d": ast.parse("class D:\n    def __init__(self): self._x = 2\n    def eq(self, o): return o._x\n")}
    assert private_uses(trees) == ["b:1 imports eyrie.jobs.a._helper", "c:1 reads a._x"]


# Who may write a generation record's object (docs/architecture.md, "durable before release"): the key functions
# that name a shard's journal, its parts and the probe's answers, and the encoder of their records.
JOURNAL_KEYS = {"eyrie.jobs.contract.layout": {"journal_key", "part_key", "probe_answers_key"},
                "eyrie.jobs.contract.records": {"encode_part"}}
JOURNAL_WRITER = "eyrie.jobs.generate.sending.journal"


def journal_writes(trees: dict[str, ast.AST]) -> list[str]:
    """Every use, outside the journal (and the modules that define them), of what writes a record's object:
    `layout.journal_key(...)`, `records.encode_part(...)` or the names imported from there."""
    found = []
    for mod, tree in trees.items():
        if mod == JOURNAL_WRITER or mod in JOURNAL_KEYS:
            continue
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and n.module in JOURNAL_KEYS:
                found += [f"{mod}:{n.lineno} imports {n.module}.{a.name}" for a in n.names
                          if a.name in JOURNAL_KEYS[n.module]]
            elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name):
                owner = f"eyrie.jobs.contract.{n.value.id}"
                if n.attr in JOURNAL_KEYS.get(owner, ()):
                    found.append(f"{mod}:{n.lineno} uses {ast.unparse(n)}")
    return found


def test_the_journal_is_the_one_writer_of_answers():
    """A record reaches a shard's journal, its parts or the probe's answers only through `Journal` (its group
    commit, `Journal.write`, `compact_shard`): one place keeps "durable before the slot is freed"."""
    assert journal_writes(_trees()) == []


def test_a_journal_write_elsewhere_would_be_found():
    trees = {"eyrie.jobs.generate.probe.run": ast.parse(
        "from eyrie.jobs.contract import layout, records\n"
        "def adopt(store, recs):\n    store.put(layout.journal_key(0, 'w', 0), records.encode_part(recs))\n"),
        "eyrie.jobs.x": ast.parse("from eyrie.jobs.contract.records import encode_part, iter_shard\n"),
        JOURNAL_WRITER: ast.parse("from eyrie.jobs.contract import layout\nk = layout.journal_key(0, 'w', 0)\n")}
    assert journal_writes(trees) == [
        "eyrie.jobs.generate.probe.run:3 uses layout.journal_key",
        "eyrie.jobs.generate.probe.run:3 uses records.encode_part",
        "eyrie.jobs.x:1 imports eyrie.jobs.contract.records.encode_part"]


def progress_reads(trees: dict[str, ast.AST]) -> list[str]:
    """Every use of progress.json's key (`layout.PROGRESS`) outside contract/progress.py: the document is read
    through `load_progress` (typed, strict) and written through `write_progress`, nowhere else."""
    allowed = {"eyrie.jobs.contract.progress", "eyrie.jobs.contract.layout"}
    found = []
    for mod, tree in trees.items():
        if mod in allowed:
            continue
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and n.module == "eyrie.jobs.contract.layout":
                found += [f"{mod}:{n.lineno} imports PROGRESS" for a in n.names if a.name == "PROGRESS"]
            elif isinstance(n, ast.Attribute) and n.attr == "PROGRESS" and getattr(n.value, "id", "") == "layout":
                found.append(f"{mod}:{n.lineno} uses layout.PROGRESS")
    return found


def test_progress_json_is_read_only_through_load_progress():
    assert progress_reads(_trees()) == []
    assert progress_reads({"eyrie.jobs.report.data": ast.parse(
        "from eyrie.jobs.contract import layout\nraw = store.get(layout.PROGRESS)\n")}) == [
        "eyrie.jobs.report.data:2 uses layout.PROGRESS"]


def client_builds(trees: dict[str, ast.AST]) -> list[str]:
    """Every `ChatClient(...)` outside the two ways to make one: a sender's (`Sender.open_client`, the paid path)
    and `ChatClient.unpaid` (the provider's unpaid GETs)."""
    allowed = {"eyrie.jobs.generate.sending.sender", "eyrie.jobs.api.client"}
    return [f"{mod}:{n.lineno}" for mod, tree in trees.items() if mod not in allowed for n in ast.walk(tree)
            if isinstance(n, ast.Call) and (getattr(n.func, "id", None) == "ChatClient"
                                            or getattr(n.func, "attr", None) == "ChatClient")]


def test_a_client_is_a_senders_or_an_unpaid_one():
    assert client_builds(_trees()) == []
    assert client_builds({"eyrie.jobs.generate.preflight": ast.parse(
        "from eyrie.jobs import api\nc = api.ChatClient('u', None, timeout=1, max_retries=0, max_concurrency=1)\n"
    )}) == ["eyrie.jobs.generate.preflight:2"]


def exception_tree(trees: dict[str, ast.AST]) -> dict[str, tuple[str, str]]:
    """Every exception class eyrie defines: name -> (module, its parent: the first base that is an exception,
    eyrie's own or Python's). Read from the source, nothing imported."""
    import builtins

    classes = {n.name: (mod, [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in n.bases])
               for mod, tree in trees.items() for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}

    def is_exception(name: str, seen: frozenset[str] = frozenset()) -> bool:
        py = getattr(builtins, name, None)
        if isinstance(py, type) and issubclass(py, BaseException):
            return True
        return name in classes and name not in seen and any(
            is_exception(b, seen | {name}) for b in classes[name][1])

    return {name: (mod, next(b for b in bases if is_exception(b)))
            for name, (mod, bases) in classes.items() if any(is_exception(b) for b in bases)}


def drawn_tree(doc: str) -> dict[str, str]:
    """The tree errors.py's docstring draws (one class a line, four spaces a level): name -> parent."""
    out, stack = {}, []
    block = doc.split("```")[1]
    for line in block.splitlines():
        if not line.strip():
            continue
        depth = (len(line) - len(line.lstrip())) // 4
        name = line.split()[0]
        del stack[depth:]
        out[name] = stack[-1] if stack else ""
        stack.append(name)
    return out


def test_every_exception_is_an_eyrie_error_and_the_tree_is_drawn_in_errors_py():
    """One root (`EyrieError`), as httpx's `_exceptions.py` has: each entry point maps it to a message and an exit
    code once. The whole tree is drawn in jobs/errors.py's docstring and kept true here."""
    import eyrie.jobs.errors as errors

    tree = exception_tree(_trees())
    roots = {name for name in tree if name != "EyrieError"}

    def rooted(name: str) -> bool:
        while name in tree:
            if name == "EyrieError":
                return True
            name = tree[name][1]
        return False

    assert sorted(n for n in roots if not rooted(n)) == []
    drawn = drawn_tree(errors.__doc__ or "")
    assert drawn == {name: ("" if name == "EyrieError" else parent) for name, (_mod, parent) in tree.items()}


def test_an_exception_outside_the_root_would_be_found():
    trees = {"eyrie.jobs.errors": ast.parse("class EyrieError(Exception): pass\nclass InputError(EyrieError): pass\n"),
             "eyrie.jobs.x": ast.parse("class Bad(ValueError): pass\nclass Good(InputError, ValueError): pass\n"
                                       "class NotOne: pass\n")}
    assert exception_tree(trees) == {"EyrieError": ("eyrie.jobs.errors", "Exception"),
                                     "InputError": ("eyrie.jobs.errors", "EyrieError"),
                                     "Bad": ("eyrie.jobs.x", "ValueError"), "Good": ("eyrie.jobs.x", "InputError")}
    assert drawn_tree("x\n```\nEyrieError\n    InputError\n        Good\n    Other\n```\n") == {
        "EyrieError": "", "InputError": "EyrieError", "Good": "InputError", "Other": "EyrieError"}


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


def _crd_fields(node: dict, path: str = "") -> set[str]:
    """Every property path of a CRD schema node, dotted."""
    out = set()
    for name, sub in (node.get("properties") or {}).items():
        out.add(f"{path}{name}")
        out |= _crd_fields(sub, f"{path}{name}.")
    for sub in (node.get("items"), node.get("additionalProperties")):
        if isinstance(sub, dict):
            out |= _crd_fields(sub, path)
    return out


def test_the_crd_carries_no_simulator_behaviour():
    """The public v1alpha1 schema keeps only what a user chooses for the embedded simulator (which builtin model
    answers and who decides its calls, its latency, its seed, and the config file that holds the rest): its faults
    and other demo and test behaviours (`SimulatorBehaviour`) are the simulator config file's, never the CRD's."""
    from eyrie.jobs.simulator.config import SimulatorBehaviour

    crd = yaml.safe_load((ROOT / "crds" / "datasetgenerations.eyrie.dev.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    fields = _crd_fields(schema)
    assert {f for f in fields if f.startswith("api.simulator.")} == {
        "api.simulator.latencyMs", "api.simulator.seed", "api.simulator.answerModel",
        "api.simulator.answerModelCalls", "api.simulator.config"}
    # the file's own behaviours; templateVariant and providers also name real spec fields (target, providerProbe)
    behaviours = set(SimulatorBehaviour.model_json_schema(by_alias=True)["properties"]) - {"templateVariant",
                                                                                           "providers"}
    assert sorted(f for f in fields if f.rpartition(".")[2] in behaviours) == []
    assert "faultRate" in behaviours and "rateLimit" in behaviours


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
