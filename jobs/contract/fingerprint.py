"""The output's fingerprint: what shapes an answer, recorded with the answers it shaped.

An output keeps answers paid for under one spec; resumed under another (another model, temperature,
provider routing), its old answers would be reused and relabelled silently. So every record carries
the fingerprint of what produced it, the store keeps the fingerprint its answers were bought under
(`fingerprint.json`), and a run whose fingerprint differs refuses to start unless the user accepts
the change field by field (`eyrie run --accept-changed FIELD...`; in a cluster the annotation
`eyrie.dev/accept-fingerprint`); an accepted change starts a new fingerprint whose answers are
labelled with it, never mixed silently with the earlier ones.

In the fingerprint (`FIELDS`): what is sent or decides how an answer is read back -
`target.model`, `api.provider` and `api.providerProbe` (routing, and the probe that derives it),
`api.sampling.*`, `api.simulator` (with the simulator, the
"model"; its latency aside; set only for `baseUrl: simulated`, so moving to a real API changes it; the
config file it names counts by what the file says, not where it is: an edited file is a changed setting),
`tools.mode` (audit runs generate structured), `generation.turns` (and, for `turns: all`,
`onDivergence` and `maxTurns`, which decide what later turns are asked), `generation.answers` (the
dataset's own answers instead of bought ones; left out while it is `regenerate`, so an output's
fingerprint reads as it did before the field existed), `target.chatFormat` and
`target.templateVariant` (the template variant policy), and `prompt.preparation` (the version of
eyrie's row -> request preparation: a release that changes what a row becomes bumps it).

Not in it: `api.baseUrl` (the same model and routing behind another address, a proxy or a restarted
server, answer alike; who answered is each record's `response.provider`), the sources (a row's
content is in its sample id, so an edited or added row is a new sample), budget, concurrency and
rate limits, retries and timeouts, streaming, headers, shards, part sizes, Ray, the tool policy and
gate (decided per record and recorded there), `target.tokenizer` (reconstruction is rebuilt from the
records every time), extraction and output.

Torch-free: the operator reads it to refuse a spec edit before it starts a job. It reads no file there:
only a simulated spec names one (its simulator config), and a cluster never runs the simulator (the spec
model refuses `baseUrl: simulated` for RayJob and Submit, the operator refuses Local).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml

from eyrie.jobs.contract import layout
from eyrie.jobs.errors import InputError
from eyrie.jobs.jsonvalues import canonical_json
from eyrie.jobs.spec import SIMULATED, DatasetGenerationSpec, SimulatorSpec
from eyrie.jobs.store import NotFound, Store, StoreError

PROMPT_PREPARATION = "1"  # bump when a release changes the request a row becomes
NOT_RECORDED = "(not recorded)"  # a field an older fingerprint (or an output without one) does not hold
ACCEPT_ANNOTATION = "eyrie.dev/accept-fingerprint"  # in a cluster: the new fingerprint's id, accepted


def _sampling(key: str) -> Callable[[DatasetGenerationSpec], Any]:
    return lambda s: s.api.sampling.dump().get(key)


def _simulator(s: DatasetGenerationSpec) -> Any:
    if s.api.base_url != SIMULATED:
        return None
    sim = (s.api.simulator or SimulatorSpec()).dump()
    sim.pop("latencyMs", None)  # how fast, not what it answers
    if "config" in sim:  # the faults, endpoints, text calls... the file holds, wherever it lies
        sim["config"] = simulator_file(sim["config"])
    return sim


def simulator_file(path: str) -> Any:
    """A simulator config file's content as parsed (YAML or JSON), as JSON values: what the fingerprint
    records of it. The file's own checks are the simulator's (`read_behaviour`, when the run starts it);
    here a file that cannot be read or parsed is refused naming it."""
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text())
    except OSError as e:
        raise InputError(f"api.simulator.config: cannot read {p}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise InputError(f"api.simulator.config: {p} is not YAML or JSON: {e}") from None
    return orjson.loads(orjson.dumps(doc if doc is not None else {}, default=str, option=orjson.OPT_NON_STR_KEYS))


def _agentic(key: str) -> Callable[[DatasetGenerationSpec], Any]:
    return lambda s: s.generation.dump().get(key) if s.generation.turns == "all" else None


def generated_mode(spec: DatasetGenerationSpec) -> str:
    """The tools mode answers are generated in: `audit` audits both, then generates structured."""
    return "text" if spec.tools.mode == "text" else "structured"


# name (the spec path users edit) -> its value in a spec, JSON-able
FIELDS: dict[str, Callable[[DatasetGenerationSpec], Any]] = {
    "target.model": lambda s: s.target.model,
    "api.provider": lambda s: s.api.provider.wire() if s.api.provider else None,
    "api.providerProbe": lambda s: s.api.provider_probe.dump() if s.api.provider_probe else None,
    "api.sampling.temperature": _sampling("temperature"),
    "api.sampling.topP": _sampling("topP"),
    "api.sampling.maxTokens": _sampling("maxTokens"),
    "api.sampling.seed": _sampling("seed"),
    "api.sampling.reasoning": _sampling("reasoning"),
    "api.simulator": _simulator,
    "tools.mode": generated_mode,
    "generation.turns": lambda s: s.generation.turns,
    "generation.onDivergence": _agentic("onDivergence"),
    "generation.maxTurns": _agentic("maxTurns"),
    "generation.answers": lambda s: s.generation.answers,
    "target.chatFormat": lambda s: s.target.chat_format,
    "target.templateVariant": lambda s: s.target.template_variant,
    "prompt.preparation": lambda _s: PROMPT_PREPARATION,
}


@dataclass(frozen=True)
class Fingerprint:
    fields: Mapping[str, Any]

    @property
    def id(self) -> str:
        """12 hex digits of the fields' hash: what each record carries."""
        return hashlib.sha256(canonical_json(dict(self.fields))).hexdigest()[:12]

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "fields": dict(self.fields)}


def fingerprint(spec: DatasetGenerationSpec, *, tools_mode: str | None = None) -> Fingerprint:
    """The fingerprint of the answers `spec` buys (`tools_mode`: another mode's, e.g. the audit's)."""
    fields = {name: get(spec) for name, get in FIELDS.items()}
    if fields["generation.answers"] == "regenerate":  # bought answers read as before the field was added
        del fields["generation.answers"]
    if tools_mode is not None:
        fields["tools.mode"] = tools_mode
    return Fingerprint(fields)


def audit_fingerprint(spec: DatasetGenerationSpec) -> Fingerprint:
    """What `eyrie audit`'s answers depend on: the same as a run's, tools sent both ways."""
    return fingerprint(spec, tools_mode="text+structured")


def pilot_key(spec: DatasetGenerationSpec) -> str:
    """What the pilot's verdict (contract/pilot.py, pilot.json) was decided for: its settings, the answers it
    compares (the audit's fingerprint: the same answers both ways, whatever the run's own mode), the run's own
    mode, the prompts it is drawn from and what turns them into hidden states. A spec with another key needs
    the pilot again (its answers and evaluation are reused where they are the same). Torch-free: the operator
    compares it with pilot.json's to know whether the pilot is done."""
    assert spec.pilot is not None
    ex = spec.extraction
    doc = {"pilot": spec.pilot.dump(), "prompts": spec.pilot_prompts(), "heldout": spec.pilot_heldout(),
           "answers": audit_fingerprint(spec).id, "own": generated_mode(spec),
           "sources": [s.dump() for s in spec.sources],
           "target": [spec.target.tokenizer, spec.target.chat_format, spec.target.template_variant],
           "extraction": [ex.engine, ex.model or spec.target.tokenizer, ex.layers, ex.dtype]}
    return hashlib.sha256(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


@dataclass(frozen=True)
class Change:
    field: str
    old: Any
    new: Any

    def describe(self) -> str:
        return f"{self.field}: {_show(self.old)} -> {_show(self.new)}"


def _show(value: Any) -> str:
    if value is None:
        return "unset"
    if value == NOT_RECORDED:
        return value
    return orjson.dumps(value).decode()


def diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    """The fields whose values differ, in `FIELDS` order (a field `old` lacks reads NOT_RECORDED)."""
    names = list(FIELDS) + sorted((set(old) | set(new)) - set(FIELDS))
    out = []
    for name in names:
        a, b = old.get(name, NOT_RECORDED), new.get(name, NOT_RECORDED)
        if canonical_json(a) != canonical_json(b):
            out.append(Change(name, a, b))
    return out


def covered(field: str, accepted: Iterable[str]) -> bool:
    """Is `field` accepted: named, or under a named prefix (`api.sampling` accepts its fields)?"""
    return any(field == a or field.startswith(a + ".") for a in accepted)


def check_accept_names(accepted: Sequence[str]) -> None:
    """Every `--accept-changed` name is a fingerprint field or a prefix of some."""
    unknown = [a for a in accepted if not any(covered(f, [a]) for f in FIELDS)]
    if unknown:
        raise InputError(f"--accept-changed: {', '.join(unknown)} is not a fingerprint field; the fields are "
                         f"{', '.join(FIELDS)} (or a prefix such as api.sampling)")


class FingerprintChanged(InputError):
    """The spec's fingerprint differs from the one the output's answers were bought under: nothing
    starts (exit 2). The message names each field, old and new, and the two ways on."""

    def __init__(self, uri: str, changes: list[Change], refused: list[Change], new_id: str, held: str):
        self.changes, self.refused, self.new_id = changes, refused, new_id
        fields = " ".join(c.field for c in refused)
        lines = "\n".join(f"  {c.describe()}" for c in refused)
        super().__init__(
            f"{uri} holds {held} bought under another spec; these fields changed:\n{lines}\n"
            "Nothing was sent. Either write to a new output (change output.uri), or keep those answers and "
            f"label the new ones with the new fingerprint {new_id}: `eyrie run SPEC --accept-changed {fields}` "
            f"(in a cluster: annotate the DatasetGeneration {ACCEPT_ANNOTATION}={new_id}).")


# ------------------------------------------------------------------------------ fingerprint.json


def read_doc(store: Store) -> dict[str, Any] | None:
    """`fingerprint.json`: {"current": id, "fingerprints": {id: {fields, since, accepted, previous}}}."""
    try:
        return orjson.loads(store.get(layout.FINGERPRINT))
    except NotFound:
        return None


def current_fields(doc: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The fields of the fingerprint the output's latest answers were bought under (None: no doc)."""
    if not doc:
        return None
    entry = (doc.get("fingerprints") or {}).get(doc.get("current")) or {}
    return dict(entry.get("fields") or {})


@dataclass(frozen=True)
class Binding:
    """What a run does to the output's fingerprint: `kind` new | same | replaced (no answers were
    kept under the old one) | accepted (the changes the user accepted); `doc` to write (None: same)."""

    kind: str
    fingerprint: Fingerprint
    changes: tuple[Change, ...] = ()
    previous: str | None = None
    doc: dict[str, Any] | None = None

    def note(self) -> str | None:
        """A line for the user, when there is something to say."""
        if self.kind == "accepted":
            what = "; ".join(c.describe() for c in self.changes)
            return (f"fingerprint {self.previous} -> {self.fingerprint.id} (accepted: {what}); earlier answers "
                    f"are kept and labelled {self.previous}, new ones {self.fingerprint.id}")
        if self.kind == "replaced":
            return f"the output held no answers: its fingerprint {self.previous} is replaced by {self.fingerprint.id}"
        return None


def bind(doc: Mapping[str, Any] | None, fp: Fingerprint, *, persisted: int, attempt: str,
         accept: Sequence[str] = (), accept_id: str | None = None, uri: str = "the output",
         now: str = "", held: str | None = None) -> Binding:
    """Pure: may a run with fingerprint `fp` write into an output under `doc` with `persisted`
    records? Raises FingerprintChanged when fields changed that were not accepted (`accept`: field
    names or prefixes; `accept_id`: the new id itself, as the operator passes it)."""
    check_accept_names(accept)
    entry = {"fields": dict(fp.fields), "since": attempt, "createdAt": now}
    if doc is None and not persisted:
        return Binding("new", fp, doc={"version": 1, "current": fp.id, "fingerprints": {fp.id: entry}})
    old = current_fields(doc) or {}  # an output without fingerprint.json: nothing was recorded
    previous = doc.get("current") if doc else None
    if doc is not None and previous == fp.id:
        return Binding("same", fp, previous=previous)
    changes = diff(old, fp.fields)
    known = dict((doc or {}).get("fingerprints") or {})
    if not persisted:
        known[fp.id] = entry
        return Binding("replaced", fp, tuple(changes), previous,
                       {"version": 1, "current": fp.id, "fingerprints": known})
    refused = [c for c in changes if not covered(c.field, accept)]
    if refused and accept_id != fp.id:
        raise FingerprintChanged(uri, changes, refused, fp.id, held or f"{persisted} persisted records")
    known[fp.id] = {**known.get(fp.id, entry), "since": known.get(fp.id, entry).get("since", attempt),
                    "accepted": [c.field for c in changes], "acceptedIn": attempt, "previous": previous}
    return Binding("accepted", fp, tuple(changes), previous, {"version": 1, "current": fp.id, "fingerprints": known})


def write_doc(store: Store, binding: Binding) -> None:
    if binding.doc is not None:
        store.put(layout.FINGERPRINT, orjson.dumps(binding.doc, option=orjson.OPT_INDENT_2))


def bind_output(store: Store, spec: DatasetGenerationSpec, attempt: str, *, accept: Sequence[str] = (),
                accept_id: str | None = None, now: str = "") -> Binding:
    """`bind` against what `store` holds (reads only: `write_doc` records the binding once the run
    may start). Counts the records only when the fingerprint differs."""
    from eyrie.jobs.contract import records

    fp = fingerprint(spec)
    try:
        doc = read_doc(store)
        if doc is not None and doc.get("current") == fp.id:
            check_accept_names(accept)
            return Binding("same", fp, previous=fp.id)
        n = answers = 0
        if records.list_shards(store):
            for rec in records.iter_records(store):
                n += 1
                answers += rec.get("status") == "ok"
    except (StoreError, orjson.JSONDecodeError) as e:
        raise InputError(f"output.uri: cannot read what the output holds ({type(e).__name__}: {e})") from None
    return bind(doc, fp, persisted=n, attempt=attempt, accept=accept, accept_id=accept_id, uri=store.uri, now=now,
                held=f"{answers} answers ({n} records)")
