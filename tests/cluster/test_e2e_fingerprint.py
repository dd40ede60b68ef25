"""A spec edit in the cluster that changes what the output's answers were bought under (issue 24, item 1):
the real operator against a real API server and KubeRay starts no attempt and says why in a condition
(not a job that would refuse and fail, not a crash loop), and the annotation the message names accepts it:
the next attempt labels its answers with the new fingerprint."""

from __future__ import annotations

import re
import time
from collections import Counter

from eyrie.jobs.contract import records
from eyrie.jobs.contract.fingerprint import ACCEPT_ANNOTATION
from eyrie.jobs.simulator import SimulatorConfig, SimulatorProcess

from .conftest import NS, condition, dsg, wait_for
from .test_e2e import gen_spec, phase_is, secrets, store_of, write_prompts
from .testbed import DSG, RAYJOBS


def test_a_spec_edit_of_the_model_starts_nothing_until_accepted_then_labels_the_new_answers(
        cluster, operator, player, s3_env, s3_bucket, tmp_path):
    secrets(cluster, s3_env)
    prompts = write_prompts(tmp_path / "p.jsonl", 40)
    with SimulatorProcess(SimulatorConfig(latency_ms=5)) as sim:
        cluster.create(DSG, NS, dsg("edit", gen_spec(prompts, s3_env, s3_bucket, sim.base_url, max_usd="0.01")))
        assert player.run_rayjob("edit-gen-1") == 3, player.log("edit-gen-1")  # BudgetExhausted part-way
        wait_for("Suspended", phase_is(cluster, "edit", "Suspended"), timeout=15)
        wait_for("attempt 1 RayJob deleted", lambda: cluster.get(RAYJOBS, NS, "edit-gen-1") is None)
        first = list(records.iter_records(store_of(s3_env, s3_bucket)))
        assert 0 < len(first) < 40

        # raise the budget, resume, and change the model in the same edit
        cluster.patch(DSG, NS, "edit", {"spec": {"budget": {"maxUSD": "1.00"}, "suspend": False,
                                                 "target": {"model": "other/model"}}})

        def refused() -> dict | None:
            c = condition(cluster, "edit", "OutputMatchesSpec")
            return c if c and c["status"] == "False" else None

        cond = wait_for("OutputMatchesSpec=False", refused, timeout=20)
        assert cond["reason"] == "SpecChanged"
        assert 'spec.target.model: "test/model" -> "other/model"' in cond["message"]
        accept = re.search(rf"{re.escape(ACCEPT_ANNOTATION)}=([0-9a-f]{{12}})", cond["message"])
        assert accept is not None, cond["message"]
        time.sleep(10 * operator.interval)  # many polls: still no attempt, one event
        assert cluster.get(RAYJOBS, NS, "edit-gen-2") is None
        warned = [e for e in cluster.events(NS, "edit") if e["reason"] == "SpecChanged"]
        assert len(warned) == 1 and warned[0]["type"] == "Warning" and warned[0]["message"] == cond["message"]
        assert sim.stats()["requests"] == len(first)  # nothing was sent under the edited spec

        cluster.patch(DSG, NS, "edit", {"metadata": {"annotations": {ACCEPT_ANNOTATION: accept.group(1)}}})
        rj = player.rayjob("edit-gen-2", timeout=30)
        env = rj["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
        assert {"name": "EYRIE_ACCEPT_FINGERPRINT", "value": accept.group(1)} in env
        assert player.run_rayjob("edit-gen-2") == 0, player.log("edit-gen-2")
        wait_for("Succeeded", phase_is(cluster, "edit", "Succeeded"), timeout=20)
    c = condition(cluster, "edit", "OutputMatchesSpec")  # the output is now bound to the edited spec
    assert c is not None and (c["status"], c["reason"]) == ("True", "FingerprintMatches")
    recs = list(records.iter_records(store_of(s3_env, s3_bucket)))
    assert len({r["sample_id"] for r in recs}) == len(recs) == 40  # the first answers kept, not bought again
    by = Counter((r["fingerprint"], r["request"]["model"]) for r in recs)
    assert by[(first[0]["fingerprint"], "test/model")] == len(first)
    assert by[(accept.group(1), "other/model")] == 40 - len(first)
