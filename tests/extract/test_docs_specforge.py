"""docs/operating.md's "Train a drafter with SpecForge", run as written: every command of its code
blocks, in order, with the files its YAML blocks name, on runs of the same formats (the quickstart's:
builtin:tiny-chat's samples and hidden states; Kimi K2.5 samples on the synthetic Kimi vocabulary, hidden
states from `builtin:tiny-llama`, which also stands in for the Kimi model). `eyrie export ...` runs eyrie's own
command line; `specforge train ...` runs SpecForge 0.2.0's own (`specforge.cli.main`) with `--plan`: it
loads the run config and the overrides, resolves the algorithm, validates the deployment (online:
disaggregated, Mooncake, the vocab mapping it cannot do without) and prints the process plan without
starting anything. The training itself needs GPUs and the target served in SGLang."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from eyrie.jobs.extract.run import builtin_model, run_extraction
from eyrie.jobs.extract.specforge import SPECFORGE_VERSION
from eyrie.jobs.reconstruct.tokenizers import load_tokenizer
from eyrie.jobs.spec import TargetSpec
from tests.extract_helpers import make_spec
from tests.specforge_helpers import conversations, need_specforge, samples_store
from tests.tokenizer_helpers import kimi_hf_folder

DOC = Path(__file__).resolve().parents[2] / "docs" / "operating.md"
QUICKSTART, KIMI, KIMI_MODEL = "./examples/eyrie-out/quickstart", "s3://eyrie/kimi-b1-glaive", "moonshotai/Kimi-K2.5"


def section() -> str:
    text = DOC.read_text()
    start = text.index("\n## Train a drafter with SpecForge\n")
    return text[start:text.index("\n## ", start + 1)]


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", section(), flags=re.S)


def commands() -> list[list[str]]:
    out = []
    for block in blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("#", 1)[0].strip() if line.lstrip().startswith("#") else line.strip()
            if line:
                out.append(shlex.split(line))
    return out


def files() -> dict[str, str]:
    """The YAML blocks that name their file on their first line (`# NAME.yaml`)."""
    named = {}
    for block in blocks("yaml"):
        first = block.splitlines()[0]
        if m := re.fullmatch(r"# (\S+\.yaml)", first):
            named[m.group(1)] = block
    return named


def extracted_run(folder: Path, tok, chat_format: str, model: str) -> str:
    """A run's output as `eyrie run` leaves it: samples rebuilt by eyrie, hidden states from `model`."""
    store, _ = samples_store(folder, tok, chat_format, conversations(True))
    run_extraction(make_spec(store.uri, model), store)
    return store.uri


@pytest.mark.integration
def test_the_docs_commands_do_what_they_say_eyrie_then_specforge(tmp_path, monkeypatch, capsys):
    need_specforge()
    from specforge.cli import main as specforge_main
    from specforge.config import load_config

    from eyrie.jobs.cli.export import export_main

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    tiny = builtin_model("builtin:tiny-llama")  # covers Kimi's ids
    chat = builtin_model("builtin:tiny-chat")  # the quickstart's target: tokenizer, template and model
    kimi = load_tokenizer(TargetSpec(model="m", tokenizer=str(kimi_hf_folder(tmp_path / "kimi-tok"))))
    quick = load_tokenizer(TargetSpec(model="m", tokenizer="builtin:tiny-chat"))
    where = {QUICKSTART: extracted_run(tmp_path / "quickstart", quick, "auto", chat),
             KIMI: extracted_run(tmp_path / "kimi", kimi, "kimi-k2.5", tiny), KIMI_MODEL: tiny}
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for name, body in files().items():
        (work / name).write_text(body)
    ran = []
    env = None  # SpecForge's own environment: where its `specforge` and `pip` are
    for argv in commands():
        argv = [where.get(a, a) for a in argv]
        if argv[:3] == ["python", "-m", "venv"]:  # not made here (no network): the test checks what goes in
            env = argv[3]
        elif env and argv[0] == f"{env}/bin/pip":
            assert argv[1:] == ["install", f"specforge=={SPECFORGE_VERSION}"], argv  # its pins, not eyrie's
            ran.append("pip install specforge")
        elif argv[0] == "cd":
            monkeypatch.chdir(argv[1])
        elif argv[:2] == ["eyrie", "export"]:
            assert export_main(argv[2:]) == 0, argv
            ran.append(" ".join(argv[:3]))
        elif argv[0] == "cat" and argv[-2] == ">":
            Path(argv[-1]).write_text("".join(Path(a).read_text() for a in argv[1:-2]))
        elif argv[0] == f"{env}/bin/specforge" and argv[1] == "train":  # in its own environment, never eyrie's
            assert argv[2] == "-c", argv
            config, overrides = argv[3], argv[4:]
            capsys.readouterr()
            assert specforge_main(["train", "-c", config, "--plan", *overrides]) == 0, argv
            assert '"kind"' in capsys.readouterr().out  # the process plan, printed
            values = yaml.safe_dump(yaml.safe_load(Path(config).read_text()))  # the settings, not the comments
            assert str(tmp_path) not in values  # portable: no path of this machine
            cfg = load_config(config, overrides)
            # every path relative to the export folder, the one it is run from
            if cfg.mode == "offline":
                assert cfg.data.hidden_states_path == "." and any(Path(".").rglob("data_*.ckpt"))
                assert Path(cfg.model.draft_model_config).is_file()
            else:
                assert Path(cfg.data.prompts_path or cfg.data.train_data_path).is_file()
                assert Path(cfg.model.vocab_mapping_path).is_file() and Path(cfg.model.draft_model_config).is_file()
            # the builtin targets exist only where eyrie is installed: the export carries a copy
            model = chat if "quickstart" in Path.cwd().name else tiny
            assert cfg.model.target_model_path == "target-model", config
            assert (Path("target-model") / "config.json").read_bytes() == (Path(model) / "config.json").read_bytes()
            ran.append(f"specforge train {cfg.mode}")
        else:
            pytest.fail(f"docs/operating.md names a command this test does not run: {argv}")
    # offline and online, for the quickstart and for Kimi K2.5
    assert sorted(ran) == sorted(["pip install specforge"] + ["eyrie export specforge"] * 2
                                 + ["eyrie export specforge-online"] * 2
                                 + ["specforge train offline"] * 2 + ["specforge train online"] * 2), ran


def test_the_custom_kimi_template_in_the_docs_is_the_one_the_tests_check():
    """The template the docs give for calling SpecForge's data code yourself is the one
    tests/extract/test_specforge_online.py shows rebuilding Kimi K2.5 exactly."""
    (block,) = blocks("python")
    tests = (Path(__file__).parent / "test_specforge_online.py").read_text()
    for field in re.findall(r'(\w+)=("[^"]*"|None|True|False)', block):
        assert f"{field[0]}={field[1]}" in tests, field
