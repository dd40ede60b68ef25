"""The SGLang backend against the pinned sglang wheel's source, without a GPU and without installing it.

`pip download --no-deps sglang==<pin>` (cached in ~/.cache/eyrie/sglang-wheel, or
$EYRIE_SGLANG_WHEEL_CACHE), unpack its Python files, and walk their AST: every module and name the
backend imports (through `__all__` and star re-exports, as Python would), the attributes it reads,
the hook targets and the signatures its hooks assume, the engine arguments it passes or refuses,
and the capture setter and flag names per model family. Bumping the pin then says what broke
before a GPU does. Skipped, saying why, only when the wheel can be neither found nor downloaded (a
failure under CI=true: tests/reference_helpers.py).
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from functools import cache
from pathlib import Path

import pytest

from eyrie.jobs.extract import sglang_backend as sb
from tests.reference_helpers import unavailable

# `pip download` on a machine whose cache lacks the wheel (a fresh one): a process and the package index
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


class Unresolvable(Exception):
    """The pinned source does something this reader does not model; extend it rather than guess."""


# ------------------------------------------------------------------------ reading the wheel


def _wheel_source() -> Path:
    cache_dir = Path(os.environ.get("EYRIE_SGLANG_WHEEL_CACHE", Path.home() / ".cache/eyrie/sglang-wheel"))
    src = cache_dir / f"src-{sb.SGLANG_VERSION}"
    if (src / "sglang" / "__init__.py").exists():
        return src
    cache_dir.mkdir(parents=True, exist_ok=True)
    wheels = sorted(cache_dir.glob(f"sglang-{sb.SGLANG_VERSION}-*.whl"))
    if not wheels:
        got = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                              "-q", "-d", str(cache_dir), f"sglang=={sb.SGLANG_VERSION}"],
                             capture_output=True, text=True, timeout=600)
        wheels = sorted(cache_dir.glob(f"sglang-{sb.SGLANG_VERSION}-*.whl"))
        if not wheels:
            unavailable("the sglang wheel", f"sglang=={sb.SGLANG_VERSION} neither cached in {cache_dir} nor "
                                            f"downloadable: {got.stderr.strip()[-300:]}")
    tmp = cache_dir / f".src-{sb.SGLANG_VERSION}.{os.getpid()}"
    with zipfile.ZipFile(wheels[0]) as z:
        z.extractall(tmp, [n for n in z.namelist() if n.startswith("sglang/") and n.endswith(".py")])
    if src.exists():  # unpacked meanwhile by another run
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.replace(src)
    return src


class Source:
    """Module-level facts of an unpacked package, read from its AST only (nothing is imported)."""

    def __init__(self, root: Path):
        self.root = root

    def path(self, module: str) -> Path | None:
        base = self.root.joinpath(*module.split("."))
        for p in (base.with_suffix(".py"), base / "__init__.py"):
            if p.exists():
                return p
        return None

    @cache  # noqa: B019 - one Source per session
    def tree(self, module: str) -> ast.Module:
        p = self.path(module)
        if p is None:
            raise FileNotFoundError(f"no module {module} in sglang=={sb.SGLANG_VERSION}")
        return ast.parse(p.read_text(), str(p))

    def _absolute(self, module: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        pkg = module if self.path(module).name == "__init__.py" else module.rpartition(".")[0]  # type: ignore[union-attr]
        for _ in range(node.level - 1):
            pkg = pkg.rpartition(".")[0]
        return f"{pkg}.{node.module}" if node.module else pkg

    def star_sources(self, module: str) -> list[str]:
        return [self._absolute(module, n) for n in self.tree(module).body
                if isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names)]

    @cache  # noqa: B019
    def defined(self, module: str) -> dict[str, ast.AST]:
        """Names bound at module level (defs, classes, assignments, imports), star imports excluded."""
        out: dict[str, ast.AST] = {}
        for n in self.tree(module).body:
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                out[n.name] = n
            elif isinstance(n, ast.Assign):
                for t in n.targets:
                    for leaf in ast.walk(t):
                        if isinstance(leaf, ast.Name):
                            out[leaf.id] = n
            elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
                out[n.target.id] = n
            elif isinstance(n, ast.Import | ast.ImportFrom):
                for a in n.names:
                    if a.name != "*":
                        out[(a.asname or a.name).split(".")[0]] = n
        return out

    def globals_(self, module: str) -> set[str]:
        names = set(self.defined(module))
        for src in self.star_sources(module):
            names |= self.exports(src)
        return names

    @cache  # noqa: B019
    def exports(self, module: str) -> frozenset[str]:
        """What `from module import *` binds: `__all__` when the module sets it, else its public names."""
        node = self.defined(module).get("__all__")
        if node is None:
            return frozenset(n for n in self.globals_(module) if not n.startswith("_"))
        value = node.value  # type: ignore[attr-defined]
        if isinstance(value, ast.List | ast.Tuple):
            return frozenset(ast.literal_eval(value))
        if isinstance(value, ast.ListComp):
            return frozenset(self._filtered_globals(module, value))
        raise Unresolvable(f"{module}: __all__ at line {node.lineno} is neither a literal nor a filter of globals()")

    def _filtered_globals(self, module: str, comp: ast.ListComp) -> set[str]:
        """`[n for n in list(globals()) if <conditions>]`, the form parallel_state uses."""
        gen = comp.generators[0]
        var = gen.target.id  # type: ignore[attr-defined]
        if "globals" not in ast.unparse(gen.iter):
            raise Unresolvable(f"{module}: __all__ comprehension over {ast.unparse(gen.iter)}")
        names = self.globals_(module)
        for cond in gen.ifs:
            names = {n for n in names if self._holds(module, cond, var, n)}
        return names

    def _holds(self, module: str, cond: ast.expr, var: str, name: str) -> bool:
        if isinstance(cond, ast.BoolOp) and isinstance(cond.op, ast.And):
            return all(self._holds(module, c, var, name) for c in cond.values)
        if isinstance(cond, ast.UnaryOp) and isinstance(cond.op, ast.Not):
            return not self._holds(module, cond.operand, var, name)
        if (isinstance(cond, ast.Call) and isinstance(cond.func, ast.Attribute) and cond.func.attr == "startswith"
                and isinstance(cond.args[0], ast.Constant)):
            return name.startswith(cond.args[0].value)
        if (isinstance(cond, ast.Compare) and isinstance(cond.ops[0], ast.In | ast.NotIn)
                and isinstance(cond.comparators[0], ast.Name)):
            inside = name in self.dict_keys(module, cond.comparators[0].id)
            return inside if isinstance(cond.ops[0], ast.In) else not inside
        raise Unresolvable(f"{module}: __all__ condition {ast.unparse(cond)}")

    def dict_keys(self, module: str, name: str) -> set[str]:
        """Keys of a module-level dict literal, plus `name["k"] = ...` assignments after it."""
        keys: set[str] = set()
        for n in self.tree(module).body:
            if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in n.targets):
                keys |= {ast.literal_eval(k) for k in n.value.keys}  # type: ignore[attr-defined]
            elif isinstance(n, ast.Assign):
                for t in n.targets:
                    if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id == name:
                        keys.add(ast.literal_eval(t.slice))
        return keys

    def importable(self, module: str, name: str) -> bool:
        """Whether `from module import name` succeeds, as far as the source decides it."""
        if self.path(module) is None:
            return False
        if name in self.defined(module):
            node = self.defined(module)[name]
            if isinstance(node, ast.ImportFrom):  # a re-export: it must exist where it comes from
                src = self._absolute(module, node)
                orig = next(a.name for a in node.names if (a.asname or a.name) == name)
                return self.importable(src, orig) or self.path(f"{src}.{orig}") is not None
            lazy = getattr(node, "value", None)
            if isinstance(lazy, ast.Call) and getattr(lazy.func, "id", "") == "LazyImport":
                target, attr = (a.value for a in lazy.args)  # type: ignore[attr-defined]
                return self.importable(target, attr)
            return True
        if any(name in self.exports(src) for src in self.star_sources(module)):
            return True
        return self.path(f"{module}.{name}") is not None  # a submodule

    def cls(self, module: str, name: str) -> tuple[str, ast.ClassDef]:
        """A class by the name `module` binds it to (following re-exports); returns (defining module, node)."""
        node = self.defined(module).get(name)
        if isinstance(node, ast.ClassDef):
            return module, node
        if isinstance(node, ast.ImportFrom):
            src = self._absolute(module, node)
            return self.cls(src, next(a.name for a in node.names if (a.asname or a.name) == name))
        for src in self.star_sources(module):
            if name in self.exports(src):
                return self.cls(src, name)
        raise LookupError(f"no class {name} in {module}")

    def method(self, module: str, cls: str, name: str) -> ast.FunctionDef:
        """A method, looked up through the bases (by their names in the defining module)."""
        mod, node = self.cls(module, cls)
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name == name:
                return item
        for base in node.bases:
            if isinstance(base, ast.Name):
                try:
                    return self.method(mod, base.id, name)
                except LookupError:
                    continue
        raise LookupError(f"{module}.{cls} has no method {name}")

    def self_attributes(self, module: str, cls: str) -> set[str]:
        """`self.<x> = ...` anywhere in the class, and its class-level names."""
        _mod, node = self.cls(module, cls)
        out = {t.id for n in node.body if isinstance(n, ast.Assign | ast.AnnAssign)
               for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
        for n in ast.walk(node):
            if (isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and isinstance(n.value, ast.Name)
                    and n.value.id == "self"):
                out.add(n.attr)
        return out


def params(fn: ast.FunctionDef) -> list[str]:
    return [a.arg for a in fn.args.posonlyargs + fn.args.args]


def all_params(fn: ast.FunctionDef) -> list[str]:
    return params(fn) + [a.arg for a in fn.args.kwonlyargs]


@pytest.fixture(scope="module")
def pin() -> Source:
    return Source(_wheel_source())


def split_target(pin: Source, target: str) -> tuple[str, str, str]:
    """'pkg.mod.Class.method' -> ('pkg.mod', 'Class', 'method'), finding where the module part ends."""
    parts = target.split(".")
    for i in range(len(parts) - 2, 0, -1):
        if pin.path(".".join(parts[:i])) is not None:
            return ".".join(parts[:i]), parts[i], ".".join(parts[i + 1:])
    raise LookupError(f"hook target {target}: no module prefix in sglang=={sb.SGLANG_VERSION}")


def load_gpu_check():
    """benchmarks/gpu_extraction.py as a module (benchmarks are scripts, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_extraction", ROOT / "benchmarks/gpu_extraction.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def backend_tree() -> ast.Module:
    return ast.parse(Path(sb.__file__).read_text())


def backend_function(name: str) -> ast.FunctionDef:
    return next(n for n in ast.walk(backend_tree()) if isinstance(n, ast.FunctionDef) and n.name == name)


# --------------------------------------------------------------------------------- the checks


def test_the_pin_is_the_one_the_package_installs():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'"sglang=={sb.SGLANG_VERSION}"' in pyproject
    assert f"sglang:v{sb.SGLANG_VERSION}" in (ROOT / "images/extractor.Dockerfile").read_text()


def test_the_reader_sees_what_python_sees(pin):
    """`sglang.srt.distributed` star-imports parallel_state, whose computed `__all__` leaves the
    deprecated getters out: the import the backend used before 0.5.23's check fails here too."""
    assert pin.importable("sglang.srt.distributed.parallel_state", "get_tensor_model_parallel_rank")
    assert not pin.importable("sglang.srt.distributed", "get_tensor_model_parallel_rank")
    # ... while communication_op, which has no __all__, leaks the get_tp_group it imported
    assert pin.importable("sglang.srt.distributed", "get_tp_group")
    assert pin.importable("sglang.srt.distributed", "GroupCoordinator")


def test_every_sglang_name_the_backend_imports_exists(pin):
    used = sb.sglang_imports()
    assert ("sglang.srt.runtime_context", "get_parallel") in used and ("sglang", "Engine") in used
    missing = [f"{m}.{n}" for m, n in used if not pin.importable(m, n)]
    assert missing == [], f"not importable in sglang=={sb.SGLANG_VERSION}: {missing}"


def test_the_tp_rank_is_a_field_of_get_parallel(pin):
    fn = pin.defined("sglang.srt.runtime_context")["get_parallel"]
    assert ast.unparse(fn.returns) == "ParallelContext"  # type: ignore[attr-defined]
    _mod, parallel = pin.cls("sglang.srt.arg_groups.fields.parallel", "Parallel")
    derived = {t.id for n in parallel.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
               and getattr(n.value.func, "id", "") == "Derived" for t in n.targets if isinstance(t, ast.Name)}
    assert "tp_rank" in derived  # ParallelContext exposes every Derived field (_install_parallel_properties)
    assert "_install_parallel_properties" in pin.defined("sglang.srt.runtime_context")


def test_plugin_loading_is_what_the_backend_relies_on(pin):
    plugins = pin.defined("sglang.srt.plugins")
    assert ast.literal_eval(plugins["GENERAL_PLUGINS_GROUP"].value) == sb.PLUGIN_GROUP  # type: ignore[attr-defined]
    # the SGLANG_PLUGINS allow-list the backend extends with its plugin's name
    assert re.search(r"^\s+SGLANG_PLUGINS = ", pin.path("sglang.srt.environ").read_text(), re.M)  # type: ignore[union-attr]
    assert "SGLANG_PLUGINS" in ast.unparse(pin.defined("sglang.srt.plugins")["load_plugins_by_group"])
    # the driver (Engine.__init__) and every scheduler process load plugins
    assert "load_plugins" in ast.unparse(pin.method("sglang.srt.entrypoints.engine", "Engine", "__init__"))
    run = pin.defined("sglang.srt.managers.scheduler")["run_scheduler_process"]
    assert "load_plugins()" in ast.unparse(run)
    # HookRegistry.register(target, hook, hook_type) and the `_patched` set the handshake reads
    reg = pin.method("sglang.srt.plugins.hook_registry", "HookRegistry", "register")
    assert params(reg)[:4] == ["cls", "target", "hook", "hook_type"]
    assert "_patched" in pin.self_attributes("sglang.srt.plugins.hook_registry", "HookRegistry")
    members = pin.self_attributes("sglang.srt.plugins.hook_registry", "HookType")
    assert {"BEFORE", "AROUND"} <= members


def test_hook_targets_exist_with_the_signatures_the_hooks_assume(pin):
    for target in sb.HOOKS:
        module, cls, meth = split_target(pin, target)
        pin.method(module, cls, meth)
    # init_attention_backends(self): enable_capture reads runner.model and runner.is_draft_worker
    module, cls, meth = split_target(pin, sb.HOOK_INIT)
    assert params(pin.method(module, cls, meth)) == ["self"]
    assert {"model", "is_draft_worker"} <= pin.self_attributes(module, cls)
    # LogitsProcessor.forward: capture_forward reads positional arguments by index
    module, cls, meth = split_target(pin, sb.HOOK_LOGITS)
    forward = params(pin.method(module, cls, meth))
    reads = [(c.args[2].value, c.args[3].value) for c in ast.walk(backend_function("capture_forward"))
             if isinstance(c, ast.Call) and getattr(c.func, "id", "") == "_arg"]
    assert len(reads) == 3
    for pos, name in reads:
        assert forward[pos] == name, f"{sb.HOOK_LOGITS} argument {pos} is {forward[pos]}, the hook reads {name}"


def test_forward_batch_fields_the_capture_reads(pin):
    fn = backend_function("capture_forward")
    batch_attrs, mode_methods = set(), set()
    for n in ast.walk(fn):
        if (isinstance(n, ast.Call) and getattr(n.func, "id", "") == "getattr"
                and getattr(n.args[0], "id", "") == "batch"):
            batch_attrs.add(n.args[1].value)
        elif isinstance(n, ast.Attribute) and getattr(n.value, "id", "") == "batch":
            batch_attrs.add(n.attr)
        elif isinstance(n, ast.Attribute) and getattr(n.value, "id", "") == "mode":
            mode_methods.add(n.attr)
    assert batch_attrs == {"forward_mode", "rids", "extend_seq_lens_cpu", "extend_prefix_lens_cpu"}
    fb = "sglang.srt.model_executor.forward_batch_info"
    assert batch_attrs <= pin.self_attributes(fb, "ForwardBatch")
    for m in mode_methods:
        pin.method(fb, "ForwardMode", m)


def test_engine_calls_and_arguments_exist(pin):
    engine = "sglang.srt.entrypoints.engine"
    generate = all_params(pin.method(engine, "Engine", "generate"))
    calls = [c for c in ast.walk(backend_tree()) if isinstance(c, ast.Call)
             and isinstance(c.func, ast.Attribute) and c.func.attr == "generate"]
    used = {k.arg for c in calls for k in c.keywords if k.arg is not None} | set(sb.logprob_request([1]))
    assert used and used <= set(generate), f"Engine.generate lacks {used - set(generate)}"
    pin.method(engine, "Engine", "shutdown")
    assert "**kwargs" in ast.unparse(pin.method(engine, "Engine", "__init__").args)  # -> ServerArgs(**kwargs)

    fields: set[str] = set()
    for p in sorted((pin.root / "sglang/srt/arg_groups/fields").glob("*.py")):
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "_NS_PATH" for n in node.body):
                fields |= {n.target.id for n in node.body if isinstance(n, ast.AnnAssign)
                           and isinstance(n.target, ast.Name) and not n.target.id.startswith("_")}
    gpu_extraction = load_gpu_check()
    args = (set(sb.engine_kwargs("m", 1, "bfloat16", False)) | set(sb.REFUSED_ENGINE_ARGS)
            | set(sb.OWNED_ENGINE_ARGS) | set(gpu_extraction.ENGINE_ARGS_USED))
    assert args - fields == set(), f"not ServerArgs fields in sglang=={sb.SGLANG_VERSION}: {args - fields}"


def test_input_logprobs_come_back_as_the_fidelity_scores_read_them(pin):
    """`engine_scores` reads meta_info["input_token_logprobs"] / ["input_top_logprobs"], one entry per
    input token from logprob_start_len on, the first without a value: what the pinned source builds."""
    tm = "sglang.srt.managers.tokenizer_manager"
    fn = pin.method(tm, "TokenizerManager", "add_logprob_to_meta_info")
    keys = {n.targets[0].slice.value for n in ast.walk(fn) if isinstance(n, ast.Assign)
            and isinstance(n.targets[0], ast.Subscript) and isinstance(n.targets[0].slice, ast.Constant)
            and getattr(n.targets[0].value, "id", "") == "meta_info"}
    assert {"input_token_logprobs", "input_top_logprobs"} <= keys
    detok = ast.unparse(pin.method(tm, "TokenizerManager", "detokenize_logprob_tokens"))
    assert "zip(token_logprobs_val, token_logprobs_idx)" in detok  # (value, token id, text) tuples
    proc = "sglang.srt.managers.scheduler_components.logprob_result_processor"
    cls = next(n.name for n in pin.tree(proc).body if isinstance(n, ast.ClassDef))
    tokens = ast.unparse(pin.method(proc, cls, "_process_input_token_logprobs"))
    assert "[None] + input_token_logprobs[:-1]" in tokens
    assert "req.origin_input_ids[req.logprob_start_len:]" in tokens
    tops = ast.unparse(pin.method(proc, cls, "_process_input_top_logprobs"))
    assert "[] if uses_scoring_positions else [None]" in tops
    fields = pin.self_attributes("sglang.srt.managers.io_struct", "GenerateReqInput")
    assert {"return_logprob", "logprob_start_len", "top_logprobs_num"} <= fields


FLAG_FAMILIES = ("qwen2_moe", "qwen3_next", "qwen3_5", "minimax_m3")  # named in issue 18


def _reads_flag(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and getattr(n.func, "id", "") == "getattr" and len(n.args) >= 2
               and isinstance(n.args[1], ast.Constant) and n.args[1].value == sb.CAPTURE_FLAG
               for n in ast.walk(node)) or any(
        isinstance(n, ast.Attribute) and n.attr == sb.CAPTURE_FLAG and isinstance(n.ctx, ast.Load)
        for n in ast.walk(node))


def _writes_flag(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setattr"
               and isinstance(n.args[1], ast.Constant) and n.args[1].value == sb.CAPTURE_FLAG
               for n in ast.walk(node)) or any(
        isinstance(n, ast.Attribute) and n.attr == sb.CAPTURE_FLAG and isinstance(n.ctx, ast.Store)
        for n in ast.walk(node))


def test_capture_setter_list_and_flag_names_per_model_family(pin):
    """Every model family with an EAGLE-3 setter captures through `layers_to_capture` or, where its
    decoder loop reads `_is_layer_to_capture`, through flags its setter sets: the names the backend
    calls and reads back. A family whose loop reads flags its EAGLE-3 setter never sets is listed."""
    models = pin.root / "sglang/srt/models"
    setters, flag_readers, unset = [], [], []
    for p in sorted(models.glob("*.py")):
        tree = pin.tree(f"sglang.srt.models.{p.stem}")
        fns = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
        eagle = [f for f in fns if f.name == sb.CAPTURE_SETTER]
        if not eagle:
            continue
        setters.append(p.stem)
        assert any(sb.CAPTURE_LIST in ast.unparse(f) or sb.CAPTURE_SETTER in ast.unparse(f.body) for f in eagle), p
        if any(f.name == "forward" and _reads_flag(f) for f in fns):
            flag_readers.append(p.stem)
            if not any(_writes_flag(f) for f in eagle):
                unset.append(p.stem)
    assert {"llama", "qwen2", "qwen3", "deepseek_v2", "gpt_oss", "qwen3_moe"} <= set(setters)
    assert set(FLAG_FAMILIES) <= set(flag_readers)
    # bailing_moe's loop reads the flag beside its list, and its setter sets the list only: it
    # captures through the list; these are the files where that has been checked by hand.
    assert set(unset) <= {"bailing_moe"}, f"flag-reading families whose EAGLE-3 setter sets no flag: {unset}"
    # Qwen3-MoE inherits Qwen2-MoE's flag-reading loop and flag-setting inner setter
    qwen3 = "sglang.srt.models.qwen3_moe"
    assert _reads_flag(pin.method(qwen3, "Qwen3MoeModel", "forward"))
    assert _writes_flag(pin.method(qwen3, "Qwen3MoeModel", sb.CAPTURE_SETTER))
    # the wrapper classes that carry the switch the backend checks
    for module, cls in (("llama", "LlamaForCausalLM"), ("qwen2_moe", "Qwen2MoeForCausalLM"),
                        ("qwen3_moe", "Qwen3MoeForCausalLM"), ("deepseek_v2", "DeepseekV2ForCausalLM")):
        pin.method(f"sglang.srt.models.{module}", cls, sb.CAPTURE_SETTER)
        assert sb.CAPTURE_SWITCH in pin.self_attributes(f"sglang.srt.models.{module}", cls)


def test_refused_engine_args_are_the_ones_that_split_rows(pin):
    """Each refused argument still exists (a rename would let it through unrefused)."""
    text = "".join(p.read_text() for p in (pin.root / "sglang/srt/arg_groups/fields").glob("*.py"))
    for name in sb.REFUSED_ENGINE_ARGS:
        assert re.search(rf"^\s+{name}: ", text, re.M), name


@pytest.mark.integration
def test_the_gpu_check_imports_and_declines_cleanly_without_cuda(tmp_path):
    """It runs the issue's checks in order on a GPU; here it must import and write `notRun`."""
    gpu = load_gpu_check()
    assert [n for n, _ in gpu.CHECKS] == ["imports", "shm", "llama", "fidelity", "chunked", "moe", "throughput", "hf"]
    out = tmp_path / "gpu.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu_extraction.py"), "--out", str(out)],
                         env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    doc = json.loads(out.read_text())
    assert doc["notRun"] == "no CUDA device" and doc["sglangPin"] == sb.SGLANG_VERSION
    assert "RESULT gpu_extraction not_run=no_cuda_device" in run.stdout
