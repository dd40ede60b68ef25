"""The Secrets a spec references (`operator/secret_refs.py`) and the env a Submit-mode job gets from them
(`operator/ray_submission.submission_env`), against a stand-in for the API client's one read. The operator's
reading of real Secrets is tested against a real API server in tests/cluster (test_api_server.py, test_e2e*.py)."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from eyrie.operator.kube import Kind
from eyrie.operator.ray_submission import submission_env
from eyrie.operator.secret_refs import SecretMissing, api_key, s3_credentials

from .test_reconcile import spec

NS = "team"


class Secrets:
    """What `Kube.get` answers for Secrets: `data` base64-encoded, None for an absent one."""

    def __init__(self, secrets: dict[str, dict[str, str]]) -> None:
        self.secrets = secrets

    async def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any] | None:
        assert (kind, namespace) == (Kind.SECRET, NS)
        data = self.secrets.get(name)
        if data is None:
            return None
        return {"metadata": {"name": name}, "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


BOTH = {"openrouter": {"api-key": "sk-or-1"}, "minio": {"accessKey": "AK", "secretKey": "SK-2"}}


async def test_values_are_read_and_decoded() -> None:
    kube: Any = Secrets(BOTH)
    sp = spec()
    assert await api_key(kube, NS, sp) == "sk-or-1"
    creds = await s3_credentials(kube, NS, sp)
    assert creds is not None and (creds.access_key, creds.secret_key) == ("AK", "SK-2")


async def test_no_reference_reads_nothing() -> None:
    kube: Any = Secrets({})
    sp = spec(api__apiKeySecretRef=None, output={"uri": "s3://out/run"})
    assert await api_key(kube, NS, sp) is None
    assert await s3_credentials(kube, NS, sp) is None


@pytest.mark.parametrize(("secrets", "read", "message"), [
    ({}, api_key, "spec.api.apiKeySecretRef: Secret 'openrouter' not found in namespace 'team'"),
    ({"openrouter": {"other": "sk-or-1"}}, api_key, "spec.api.apiKeySecretRef: Secret 'openrouter' has no key "
                                                    "'api-key'"),
    ({}, s3_credentials, "spec.output.credentialsSecretRef.accessKeyKey: Secret 'minio' not found in namespace "
                         "'team'"),
    ({"minio": {"accessKey": "AK"}}, s3_credentials, "spec.output.credentialsSecretRef.secretKeyKey: Secret 'minio' "
                                                     "has no key 'secretKey'"),
])
async def test_a_missing_secret_or_key_names_the_field_never_a_value(secrets, read, message) -> None:
    kube: Any = Secrets(secrets)
    with pytest.raises(SecretMissing) as e:
        await read(kube, NS, spec())
    assert str(e.value) == message
    assert "AK" not in str(e.value) and "sk-or-1" not in str(e.value)


async def test_a_submission_carries_the_keys_in_its_env() -> None:
    """An existing Ray cluster has no pod env of ours: the keys travel in the job's runtime_env."""
    kube: Any = Secrets(BOTH)
    env = await submission_env(kube, NS, spec(), "3", "uid-1")
    assert env["EYRIE_ATTEMPT"] == "3" and env["EYRIE_RUN_ID"] == "uid-1"
    assert env["EYRIE_S3_ENDPOINT"] == "http://minio:9000"
    assert (env["EYRIE_API_KEY"], env["EYRIE_S3_ACCESS_KEY"], env["EYRIE_S3_SECRET_KEY"]) == ("sk-or-1", "AK", "SK-2")
    assert "RAY_JOB_STOP_WAIT_TIME_S" in env
    assert "EYRIE_RUN_ID" not in await submission_env(kube, NS, spec(), "3", "")
    with pytest.raises(SecretMissing):
        await submission_env(Secrets({"openrouter": {"api-key": "k"}}), NS, spec(), "1", "u")  # type: ignore[arg-type]
