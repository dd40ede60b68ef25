"""The builtin models ship with eyrie (jobs/extract/builtin/): every machine loads the same weights,
checked against MANIFEST.json's hashes; a file that does not match is an error, never a rebuild; and
`build`, the recipe they were made with, made them: a rebuild here agrees with them (bit for bit on
the platform that trained them, else within what another CPU's rounding makes of 1,600 training steps,
measured and printed)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from eyrie.jobs import shipped
from eyrie.jobs.extract import tiny

ROOT = Path(__file__).resolve().parents[2]
# Held-out NLL of the same recipe trained on three kernel paths of one AMD EPYC (AVX-512, AVX2, and
# MKL's and ATen's plain x86-64 code): version 2 0.5239, 0.5160, 0.5239 (1.5% apart); version 1 0.6509,
# 0.6495, 0.6432 (1.2%), while the weights differ by up to 52% of a tensor's range. 5% allows another
# CPU's rounding and no other recipe.
NLL_SPREAD = 0.05


@pytest.fixture
def shipped_copy(tmp_path, monkeypatch):
    """The shipped models copied to a folder the test may damage, in place of the installed ones."""
    copy = shutil.copytree(shipped.SHIPPED, tmp_path / "builtin")
    monkeypatch.setattr(shipped, "SHIPPED", copy)
    monkeypatch.setenv("EYRIE_CACHE_DIR", str(tmp_path / "cache"))
    shipped.clear_checks()
    yield copy
    shipped.clear_checks()


def test_every_shipped_file_has_the_hash_the_manifest_records():
    doc = json.loads((shipped.SHIPPED / "MANIFEST.json").read_text())
    assert doc["version"] == shipped.VERSION and set(doc["models"]) == set(shipped.NAMES)
    for name in shipped.TRAINED:
        entry = doc["models"][name]
        folder = shipped.SHIPPED / entry["folder"]
        assert sorted(p.name for p in folder.iterdir()) == sorted(entry["files"])
        for file, digest in entry["files"].items():
            assert hashlib.sha256((folder / file).read_bytes()).hexdigest() == digest, (name, file)
        assert tiny.model_folder(name) == folder
    size = sum(p.stat().st_size for p in shipped.SHIPPED.rglob("*") if p.is_file())
    assert size < 3_000_000  # two models of ~0.9 MB; the impostors are derived, not shipped


def test_the_wheel_takes_every_shipped_file():
    """pyproject.toml's package data for eyrie.jobs.extract (setuptools' globs) covers builtin/ whole."""
    import tomllib

    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    package = shipped.SHIPPED.parent
    taken = {p for g in globs["eyrie.jobs.extract"] for p in package.glob(g) if p.is_file()}
    assert taken == {p for p in shipped.SHIPPED.rglob("*") if p.is_file()}


def test_the_impostors_are_derived_exactly_from_the_shipped_weights(shipped_copy, tmp_path):
    """int8 and fp8 rounding is elementwise IEEE arithmetic: the same bits on any CPU, so the
    manifest's digest of their weights holds wherever they are derived."""
    from safetensors.torch import load_file

    base = tiny.model_folder("builtin:tiny-chat")
    for name in shipped.DERIVED:
        folder = tiny.model_folder(name)
        assert folder.parent == tmp_path / "cache" / "models"
        want = shipped.manifest()["models"][name]["weightsSha256"]
        assert tiny.weights_sha256(load_file(folder / shipped.WEIGHTS)) == want
        for f in base.iterdir():  # config, tokenizer and template: tiny-chat's, byte for byte
            if f.name != shipped.WEIGHTS:
                assert (folder / f.name).read_bytes() == f.read_bytes(), (name, f.name)
    assert shipped.tokenizer_folder("builtin:tiny-chat-int8") == base


def test_a_file_that_does_not_match_is_an_error_not_a_rebuild(shipped_copy):
    weights = shipped_copy / "tiny-chat-seed1" / shipped.WEIGHTS
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of one weight
    weights.write_bytes(bytes(data))
    with pytest.raises(shipped.BuiltinModelError, match=r"builtin:tiny-chat-seed1: .*tiny-chat-seed1/model\."
                                                     r"safetensors has sha256 [0-9a-f]{64}, MANIFEST\.json says "
                                                     r"[0-9a-f]{64}: reinstall eyrie"):
        tiny.model_folder("builtin:tiny-chat-seed1")
    assert weights.read_bytes() == bytes(data)  # left as it was found: nothing rebuilt it
    (shipped_copy / "tiny-chat" / "tokenizer.json").unlink()
    with pytest.raises(shipped.BuiltinModelError, match=r"tokenizer\.json has sha256 missing"):
        shipped.tokenizer_folder("builtin:tiny-chat-fp8")


def test_a_derived_model_that_does_not_match_is_an_error(shipped_copy):
    from safetensors.torch import load_file, save_file

    folder = tiny.model_folder("builtin:tiny-chat-int8")
    tensors = load_file(folder / shipped.WEIGHTS)
    tensors["model.norm.weight"][0] += 1e-3
    save_file(tensors, folder / shipped.WEIGHTS, metadata={"format": "pt"})
    shipped.clear_checks()  # another process, finding the damaged cache
    with pytest.raises(shipped.BuiltinModelError, match=r"builtin:tiny-chat-int8: the weights in .*have digest "
                                                     r"[0-9a-f]{64}, MANIFEST\.json says [0-9a-f]{64}: delete "):
        tiny.model_folder("builtin:tiny-chat-int8")


def test_another_recipe_version_than_the_shipped_one_says_how_to_rebuild(shipped_copy, monkeypatch):
    monkeypatch.setattr(shipped, "VERSION", shipped.VERSION + 1)
    with pytest.raises(shipped.BuiltinModelError, match=rf"recipe version {shipped.VERSION - 1}, jobs/shipped\.py's "
                                                     rf"VERSION is {shipped.VERSION}: rebuild them with python "
                                                     r"hack/tiny_models\.py"):
        tiny.model_folder("builtin:tiny-chat")


@pytest.mark.integration  # a child process: the recipe trained again
def test_a_rebuild_agrees_with_the_shipped_weights():
    """`hack/tiny_models.py --check` trains tiny-chat again (one model: the cheapest that shows it; seed1
    costs the same) in a child process and compares. On the platform MANIFEST.json records (CPU, torch,
    transformers, tokenizers, the kernels BUILD_ENV pins) the rebuild is the shipped model bit for bit.
    Elsewhere the figures say by how much it differs: the tokenizer is the same (no float in it), the
    weights those of another model of the same recipe (chaotic: training carries a last-bit difference of
    one sum into every weight), and its held-out NLL within NLL_SPREAD of the shipped model's."""
    r = subprocess.run([sys.executable, "hack/tiny_models.py", "--check", "--only", "builtin:tiny-chat"],
                       cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout)
    got = report["models"]["builtin:tiny-chat"]
    print(json.dumps({"platform": report["platform"], "shippedOn": report["shippedOn"], **got}, indent=1))
    assert got["weights"]["sameNamesAndShapes"]
    if report["platform"] == report["shippedOn"]:
        assert got["differentFiles"] == [], got
        assert got["weights"]["equalTensors"] == got["weights"]["tensors"]
        assert got["heldOutNLL"]["rebuilt"] == got["heldOutNLL"]["shipped"]
    else:
        shipped, rebuilt = got["heldOutNLL"]["shipped"], got["heldOutNLL"]["rebuilt"]
        assert abs(rebuilt - shipped) <= NLL_SPREAD * shipped, got["heldOutNLL"]
        assert "tokenizer.json" in got["identicalFiles"] or report["platform"]["tokenizers"] != \
            report["shippedOn"]["tokenizers"], got
