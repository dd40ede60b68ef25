"""The README's first screen and the install it gives, as a new user meets them (issue 45 items 1
and 11): the two commands in two code blocks (copying the first never runs the tests), the first
installing all `eyrie evaluate` needs (SpecForge's own code, `--no-deps`), the CPU-only torch advice
beside it, true words about the tiny model (its weights ship with the package), and the summary's
template-variant line explained where the README points."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
OPERATING = (ROOT / "docs" / "operating.md").read_text()
FENCE = re.compile(r"^```[a-z]*\n(.*?)^```", re.S | re.M)


def blocks() -> list[tuple[int, str]]:
    """(the line the block ends on, its text) of every fenced block, in order."""
    return [(README[: m.end()].count("\n"), m.group(1)) for m in FENCE.finditer(README)]


def test_the_two_commands_are_two_code_blocks():
    (_, first), (_, second) = blocks()[:2]
    assert "eyrie run examples/quickstart.yaml" in first and "pytest" not in first
    assert "pytest" in second and "eyrie run" not in second and "hack/test-deps.sh" in second
    assert len([x for x in first.splitlines() if x.strip()]) == 1  # one line: copied whole, run whole


def test_the_first_command_installs_what_eyrie_evaluate_needs():
    (_, first) = blocks()[0]
    assert re.search(r"-e '\.\[[^\]]*\bspecforge\b[^\]]*\]'", first), first  # datasets and tqdm, its imports
    assert re.search(r"--no-deps specforge==0\.2\.0", first), first  # its own pins are not eyrie's
    assert first.index("--no-deps specforge") < first.index("eyrie run")
    # the evaluate section of the guide gives the same install line
    section = OPERATING[OPERATING.index("## Does it matter for the drafter?"):]
    section = section[: section.index("\n## ", 10)]
    assert "pip install --no-deps specforge==0.2.0" in section and "eyrie[specforge]" in section


def test_the_cpu_only_torch_advice_sits_next_to_the_first_command():
    end, _ = blocks()[0]
    after = "\n".join(README.splitlines()[end: end + 8])
    assert "https://download.pytorch.org/whl/cpu" in after, after


def test_the_tiny_model_is_said_to_ship_with_the_package_and_does():
    first_screen = README[: README.index("## What it is")]
    assert "trains on your CPU the first time" not in first_screen and "builds and trains" not in first_screen
    assert re.search(r"weights ship with (eyrie|the package)", first_screen), first_screen
    builtin = ROOT / "jobs" / "extract" / "builtin"
    manifest = json.loads((builtin / "MANIFEST.json").read_text())
    tiny = manifest["models"]["builtin:tiny-chat"]
    assert any(f.endswith(".safetensors") for f in tiny["files"])
    for f in tiny["files"]:
        assert (builtin / tiny["folder"] / f).is_file(), f
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert "builtin/" in pyproject and "safetensors" in pyproject  # package data: in the wheel


def test_the_template_variant_line_of_the_summary_is_explained():
    at = README.index("template variant of auto per provider")
    link = re.search(r"\(docs/operating\.md#([a-z0-9-]+)\)", README[at: at + 400])
    assert link, "the README names the summary's template-variant line and links its explanation"
    anchor = link.group(1)
    heads = {re.sub(r"[^a-z0-9 -]", "", h.lower()).strip().replace(" ", "-"): h
             for h in re.findall(r"^#+ (.+)$", OPERATING, re.M)}
    assert anchor in heads, (anchor, sorted(heads))
    at = OPERATING.index(heads[anchor])
    section = OPERATING[at: at + 4000]
    assert "template variant of auto per provider" in section
    assert "detected" in section and "counted" in section
