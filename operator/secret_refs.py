"""The values of the Secrets a spec references (`spec.api.apiKeySecretRef`,
`spec.output.credentialsSecretRef`), read from the API server on each use.

One place turns a missing Secret or key into `SecretMissing`, whose message names the spec field and never a
value: the operator shows it in the `SecretsReady` condition (and one Warning event) while it waits.
"""

from __future__ import annotations

import base64

from eyrie.jobs.errors import EyrieError
from eyrie.jobs.spec import DatasetGenerationSpec
from eyrie.jobs.store import S3Credentials

from .kube import Kind, Kube

API_KEY_FIELD = "spec.api.apiKeySecretRef"


class SecretMissing(EyrieError, LookupError):
    """A referenced Secret or key is absent; the message names the spec field, never a value."""


async def read_secret(kube: Kube, namespace: str, name: str, keys: list[tuple[str, str]]) -> dict[str, str]:
    """The Secret's values for `keys` ([(field, key)]); SecretMissing names the field otherwise."""
    doc = await kube.get(Kind.SECRET, namespace, name)
    field0 = keys[0][0]
    if doc is None:
        raise SecretMissing(f"{field0}: Secret {name!r} not found in namespace {namespace!r}")
    data = doc.get("data") or {}
    out = {}
    for spec_field, key in keys:
        if key not in data:
            raise SecretMissing(f"{spec_field}: Secret {name!r} has no key {key!r}")
        out[key] = base64.b64decode(data[key]).decode()
    return out


async def api_key(kube: Kube, namespace: str, spec: DatasetGenerationSpec) -> str | None:
    """The provider's API key, or None when the spec references no Secret for it."""
    ref = spec.api.api_key_secret_ref
    if ref is None:
        return None
    return (await read_secret(kube, namespace, ref.name, [(API_KEY_FIELD, ref.key)]))[ref.key]


async def s3_credentials(kube: Kube, namespace: str, spec: DatasetGenerationSpec) -> S3Credentials | None:
    """The output store's keys, or None when the spec references no Secret for them."""
    ref = spec.output.credentials_secret_ref
    if ref is None:
        return None
    vals = await read_secret(kube, namespace, ref.name, [
        ("spec.output.credentialsSecretRef.accessKeyKey", ref.access_key_key),
        ("spec.output.credentialsSecretRef.secretKeyKey", ref.secret_key_key)])
    return S3Credentials(vals[ref.access_key_key], vals[ref.secret_key_key])
