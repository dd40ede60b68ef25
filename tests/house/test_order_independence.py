"""The suite's outcome does not depend on the order its tests run in: the two tests issue 36 found
coupled through torch's thread count (an in-process simulator decoding with the answer model, and the
extractor's resume across a killed child process), each order in a pytest of its own. The autouse
fixture in conftest.py fails any test that leaves torch's thread count or seed, the working directory
or the root logger changed, the cause; this is the symptom, checked where it was seen."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAIR = ("tests/simulator/test_answer_model.py::test_the_served_text_is_the_models_greedy_answer",
        "tests/extract/test_extract.py::test_resume_after_the_extractor_is_killed_mid_shard")


@pytest.mark.integration
@pytest.mark.parametrize("order", [PAIR, PAIR[::-1]], ids=["simulator-first", "resume-first"])
def test_the_pair_passes_in_either_order(order):
    r = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", *order],
                       cwd=ROOT, capture_output=True, text=True, timeout=1200)
    ran = re.findall(r"^(tests/\S+::\S+) (PASSED|FAILED|ERROR)", r.stdout, re.M)
    assert [node for node, _ in ran] == list(order), r.stdout[-3000:]  # in the order given, each once
    assert r.returncode == 0 and {outcome for _, outcome in ran} == {"PASSED"}, r.stdout[-3000:]
