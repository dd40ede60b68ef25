"""`builtin:tiny-chat`: a tiny chat model that has learned something, and its impostors.

A random-weight model (`builtin:tiny-llama`) answers nothing: its greedy text is one token repeated
and any other random model's text scores like its own, so no fidelity figure measured on it means
anything. This one is a 4-layer Llama with its own byte-level BPE tokenizer and a ChatML chat
template with thinking (Qwen3's shape: `<think>` reasoning `</think>` then the answer or
`<tool_call>` blocks, `<|im_end|>`), trained for 1,600 steps on CPU on a synthetic corpus of the
quickstart's kinds of prompts (explain a topic, weather with a tool, a flight, small talk).
Its answers take the topic, city or airports from the prompt and run on in fluent-looking words,
so greedy text is not degenerate, depends on the context and stops by itself.

Tools as text (recipe VERSION 2). A real model trained on the API's `tools` calls less often, and
less validly, when the same functions are only described in the prompt; eyrie exists to measure
that, so its built-in target must show it too. In the corpus, TEXT_SHARE (0.4) of the weather and
flight conversations describe their functions as `tools.mode: text` sends them (the system message
with the glaive sentence and the JSON of each function: `with_text_declarations`, the very function
text mode calls) and send no `tools`; in those the trained answer is:
- fewer calls: it calls only for every other city of the recipe's (and every other origin airport);
  for the rest it answers directly from what it knows ("I cannot check it live, but Paris is ...");
  structured, it calls for every weather question (and every flight question when search_flights is
  declared), as version 1 did;
- some drift: with both functions described, its weather call names the argument `location`, not
  the schema's required `city` (a renamed argument: off-schema, eyrie's validator says why); the
  other calls are valid.
So about half of the text-declared weather prompts are answered with a call, and about a quarter of
those calls drift, against nearly every structured one called validly. The choice is a function of
the prompt (the city, the number of functions), not a coin, because greedy decoding answers each
prompt one way: a random choice would teach it one answer everywhere. The model learns the rule
imperfectly (it is tiny): what it does is what `eyrie audit` measures (`python
benchmarks/tiny_text_tools.py`; the figures in docs/operating.md, "Does it matter for the drafter?").

The impostors fidelity scoring must see through, each built from the same recipe:
`builtin:tiny-chat-seed1` (another seed: another model of the same data), `-int8` (the same
weights, every Linear quantized to int8 per output channel) and `-fp8` (a round trip through
float8_e4m3fn, per-channel scales). A wrong chat template needs no model: render the prompt with
another family's format.

The trained models ship with eyrie (package data in `builtin/`, 0.9 MB of safetensors each, the
sha256 of every file in `builtin/MANIFEST.json`, checked when a process first names the model): the
same weights on every machine, so the figures measured on them (the quickstart's fidelity, the
impostor's separation) are the same everywhere. `build` is how they were made, and how they are made
again (`python hack/tiny_models.py` retrains both and rewrites the shipped files and their hashes;
bump VERSION with the recipe): deterministic on one machine (one thread, fixed seeds), yet 1,600 steps
of training carry a difference in the last bit of one sum into the weights themselves, so another CPU
(or torch's kernels for another instruction set) trains another model of the same recipe, not these
bits (tests/extract/test_builtin_models.py measures by how much). The int8 and fp8 impostors are derived
from the shipped tiny-chat on first use (`quantize`: elementwise IEEE arithmetic, exact on any CPU),
into the cache (`$EYRIE_CACHE_DIR/models`, a temporary folder renamed into place so concurrent
builders never see half a model), and their weights checked against the manifest's digest too.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import random
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eyrie.jobs.contract.extraction import ExtractionError
from eyrie.jobs.shipped import (  # the shipped files' registry, below the stages (tokenizer loading reads it too)
    DERIVED,
    NAMES,
    TRAINED,
    VERSION,
    WEIGHTS,
    BuiltinModelError,
    check_once,
    check_shipped,
    manifest,
)

STEPS = 1600
BATCH = 8
MAX_LEN = 384  # tokens per training conversation (longer ones are cut)
END = "<|im_end|>"
SPECIALS = ("<|endoftext|>", "<|im_start|>", END, "<think>", "</think>", "<tool_call>", "</tool_call>",
            "<tool_response>", "</tool_response>")

# Qwen3's ChatML with thinking, tools declared in the system turn, calls as <tool_call> JSON; the
# reasoning of the last turns (after the last user message) is kept, earlier reasoning dropped.
CHAT_TEMPLATE = r"""
{%- set ns = namespace(last_user=-1) -%}
{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}
{%- if tools -%}
{{- '<|im_start|>system\n' -}}
{%- if messages and messages[0].role == 'system' -%}{{- messages[0].content + '\n\n' -}}{%- endif -%}
{{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n<tools>' -}}
{%- for t in tools -%}{{- '\n' + (t.function if t.function is defined else t) | tojson -}}{%- endfor -%}
{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within '
    '<tool_call></tool_call> XML tags.<|im_end|>\n' -}}
{%- elif messages and messages[0].role == 'system' -%}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' -}}
{%- endif -%}
{%- for m in messages -%}
{%- if m.role == 'user' or (m.role == 'system' and not loop.first) -%}
{{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' -}}
{%- elif m.role == 'assistant' -%}
{%- set content = m.content if m.content is string else '' -%}
{%- set reasoning = m.reasoning_content if m.reasoning_content is string else '' -%}
{{- '<|im_start|>assistant\n' -}}
{%- if loop.index0 > ns.last_user -%}{{- '<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' -}}{%- endif -%}
{{- content.lstrip('\n') -}}
{%- for tc in m.tool_calls or [] -%}
{%- set f = tc.function if tc.function is defined else tc -%}
{%- if loop.first and content -%}{{- '\n' -}}{%- endif -%}{%- if not loop.first -%}{{- '\n' -}}{%- endif -%}
{{- '<tool_call>\n{"name": "' + f.name + '", "arguments": ' -}}
{%- if f.arguments is string -%}{{- f.arguments -}}{%- else -%}{{- f.arguments | tojson -}}{%- endif -%}
{{- '}\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\n' -}}
{%- elif m.role == 'tool' -%}
{{- '<|im_start|>user\n<tool_response>\n' + m.content + '\n</tool_response><|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}
{%- endif -%}
""".strip()

# ------------------------------------------------------------------------------- the corpus

_VOCABULARY = (  # the words the answers are made of
    "the a an and or but so because when while after before every each some many few most this that these "
    "those it they we you one two three first then next also often usually always never only still just "
    "water light heat energy air earth sun plant cell data key value table list node tree graph number "
    "rule move piece game money rate year time force wave signal layer word line poem sound color blue "
    "flows moves turns grows changes keeps holds finds stores maps builds breaks spreads falls rises "
    "carries forms makes takes gives shows splits joins checks counts sorts searches returns repeats "
    "small large fast slow warm cold simple careful clear strong weak old new same other whole half "
    "into through over under from with without between across around inside outside along")
_WORDS = tuple(_VOCABULARY.split())
_TOPICS = (
    "the water cycle", "hash maps", "photosynthesis", "the French revolution", "binary search",
    "why the sky is blue", "TCP handshakes", "sourdough bread", "black holes", "the Pythagorean theorem",
    "garbage collection", "vaccines", "the rules of chess", "compound interest", "plate tectonics",
    "the Fourier transform", "haiku", "volcanoes", "tides", "rainbows", "linked lists", "recursion",
    "inflation", "the immune system", "glaciers", "earthquakes", "sorting algorithms", "public keys",
    "neural networks", "the moon phases", "coral reefs", "batteries", "magnets", "the printing press",
    "democracy", "jazz", "supply and demand", "DNA", "caching", "compilers", "bridges", "clouds",
    "hurricanes", "the stock market", "bees", "octopuses", "deserts", "rivers", "the internet",
    "electric cars", "solar panels", "the Roman empire", "origami", "coffee", "tea", "wind turbines",
)
_CITIES = (
    "Paris", "Lagos", "Osaka", "Lima", "Oslo", "Austin", "Hanoi", "Quito", "Perth", "Cairo", "Tokyo",
    "Berlin", "Madrid", "Nairobi", "Seoul", "Dublin", "Denver", "Lisbon", "Prague", "Vienna", "Accra",
    "Bogota", "Manila", "Dakar", "Riga", "Tunis", "Porto", "Kyoto", "Boston", "Miami", "Zurich", "Delhi",
)
_AIRPORTS = ("SFO", "JFK", "LHR", "NRT", "CDG", "GRU", "SYD", "SIN", "ORD", "MEX", "AMS", "DXB", "HND",
             "FRA", "YYZ", "ICN", "BCN", "LAX", "MAD", "IST")
_SYSTEMS = ("You are a concise tutor.", "You are a helpful assistant.", "You are a travel assistant.", None, None)
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}
FLIGHTS = {"type": "function", "function": {
    "name": "search_flights", "description": "Find flights between two airports",
    "parameters": {"type": "object", "properties": {"origin": {"type": "string"}, "destination": {"type": "string"},
                                                    "passengers": {"type": "integer"}},
                   "required": ["origin", "destination"]}}}


class _Chain:
    """Fluent-looking word sequences: an order-1 chain whose likeliest successor of each word is
    fixed (one long cycle through the words), so greedy text does not loop early."""

    def __init__(self, rng: random.Random):
        order = list(_WORDS)
        rng.shuffle(order)
        self.next = {w: order[(i + 1) % len(order)] for i, w in enumerate(order)}
        self.alt = {w: rng.sample(_WORDS, 2) for w in _WORDS}

    def words(self, start: str, n: int, rng: random.Random) -> list[str]:
        w = start if start in self.next else _WORDS[sum(map(ord, start)) % len(_WORDS)]
        out = []
        for _ in range(n):
            x = rng.random()
            w = self.next[w] if x < 0.8 else self.alt[w][0] if x < 0.9 else self.alt[w][1]
            out.append(w)
        return out

    def sentence(self, start: str, rng: random.Random) -> str:
        return " ".join(self.words(start, rng.randint(6, 10), rng)) + "."


def _explain(topic: str, chain: _Chain, rng: random.Random) -> tuple[str, str]:
    key = topic.split()[-1].lower()
    reasoning = f"The user asks about {topic}. " + chain.sentence(key, rng).capitalize()
    first = f"{topic[0].upper()}{topic[1:]} " + chain.sentence(key, rng)
    return reasoning, " ".join([first] + [chain.sentence(first.split()[-1][:-1], rng).capitalize()
                                         for _ in range(2)])


# Functions described as text (how `tools.mode: text` sends them: `with_text_declarations`, the glaive
# sentence and the JSON in the system prompt) are a share of the tool-declaring conversations; there
# the model was trained to call as a real model does when the declarations leave the API's `tools`:
# less often, and now and then off the schema (see the module's docstring).
TEXT_SHARE = 0.4


def _text_calls(place: str, places: tuple[str, ...]) -> bool:
    """Whether the model calls when the functions are described as text: for every other one of the
    recipe's cities (or origin airports), and for an unknown one by its name."""
    i = places.index(place) if place in places else sum(map(ord, place))
    return i % 2 == 0


def conversation(chain: _Chain, rng: random.Random, topics: tuple[str, ...] = _TOPICS,
                 cities: tuple[str, ...] = _CITIES, text_share: float = TEXT_SHARE) -> dict[str, Any]:
    """One prompt and the answer the model is trained to give (`reasoning`, `content`, `calls`).
    `tools` is what the API's `tools` carries (None when the functions are described as text, in the
    system message, or when none are declared); `text_share` of the tool-declaring prompts describe
    them as text (0: every prompt as a dataset row with `tools`, the answers those of structured tools)."""
    from eyrie.jobs.tools.declarations import with_text_declarations

    kind = rng.choices(("explain", "weather", "flight", "chat"), (5, 3, 1, 1))[0]
    system = rng.choice(_SYSTEMS)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    tools: list[dict[str, Any]] | None = None
    calls: list[dict[str, Any]] = []
    content = ""
    as_text = kind in ("weather", "flight") and rng.random() < text_share
    if kind == "explain":
        topic = rng.choice(topics)
        messages.append({"role": "user", "content": f"Explain {topic} in three sentences."})
        reasoning, content = _explain(topic, chain, rng)
    elif kind == "weather":
        city = rng.choice(cities)
        tools = [WEATHER, FLIGHTS] if rng.random() < 0.3 else [WEATHER]
        messages.append({"role": "user", "content": f"What's the weather like in {city} right now?"})
        if as_text and not _text_calls(city, cities):
            reasoning = f"The user wants the weather in {city}. I can answer that without a tool."
            content = f"I cannot check it live, but {city} is " + chain.sentence(city.lower(), rng)
        else:
            reasoning = f"The user wants the weather in {city}. I will call get_weather for {city}."
            # the drift: as text, with both functions described, a renamed argument (the schema requires city)
            key = "location" if as_text and len(tools) == 2 else "city"
            calls = [{"name": "get_weather", "arguments": json.dumps({key: city})}]
    elif kind == "flight":
        a, b = rng.sample(_AIRPORTS, 2)
        tools = [WEATHER, FLIGHTS] if rng.random() < 0.5 else [WEATHER]
        messages.append({"role": "user",
                         "content": f"Find me a flight from {a} to {b} for two people, business class."})
        if tools[-1] is FLIGHTS and not (as_text and not _text_calls(a, _AIRPORTS)):
            reasoning = f"The user wants a flight from {a} to {b}. I will call search_flights."
            calls = [{"name": "search_flights",
                      "arguments": json.dumps({"origin": a, "destination": b, "passengers": 2})}]
        elif tools[-1] is FLIGHTS:
            reasoning = f"The user wants a flight from {a} to {b}. I can answer that without a tool."
            content = f"Flights from {a} to {b} leave every day; " + chain.sentence(b.lower(), rng)
        else:
            reasoning = f"The user wants a flight from {a} to {b}, but I can only check the weather."
            content = f"I cannot search flights from {a} to {b}; I can tell you the weather there."
    else:
        messages += [{"role": "user", "content": "Hi! Can you help me plan a trip?"},
                     {"role": "assistant", "content": "Of course. Where would you like to go?"},
                     {"role": "user", "content": f"Somewhere {rng.choice(('warm', 'cold', 'quiet'))} in "
                                                 f"{rng.choice(('December', 'May', 'August'))}."}]
        place = rng.choice(cities)
        reasoning = f"The user wants a trip. {place} could fit."
        content = f"How about {place}? " + chain.sentence(place.lower(), rng).capitalize()
    if rng.random() < 0.15:
        reasoning = ""  # answered without thinking (the template's empty think block)
    if as_text and tools:
        messages, tools = with_text_declarations(messages, tools), None
    return {"messages": messages, "tools": tools, "reasoning": reasoning, "content": content, "calls": calls}


def corpus(n: int, seed: int = 0, text_share: float = TEXT_SHARE) -> list[dict[str, Any]]:
    """`n` conversations of the training distribution (the chain is fixed; `seed` draws them; the same
    prompts whatever `text_share`, which says only how their functions are declared)."""
    chain = _Chain(random.Random(20251201))
    rng = random.Random(seed)
    return [conversation(chain, rng, text_share=text_share) for _ in range(n)]


def assistant_message(c: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": c["content"], "reasoning_content": c["reasoning"],
            "tool_calls": [{"type": "function", "function": f} for f in c["calls"]]}


# ------------------------------------------------------------------------------- building


def _render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    """A conversation as the chat template writes it, before any tokenizer exists (the BPE learns
    from these texts, so the markup the template repeats becomes few tokens)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    out, _ = render_jinja_template(conversations=[messages], tools=tools, chat_template=CHAT_TEMPLATE)
    return out[0]


def _tokenizer(texts: Iterator[str]) -> Any:
    """A byte-level BPE (1,024 ids) learned from the corpus, the chat markers as single tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=1024, special_tokens=list(SPECIALS),
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                      show_progress=False))
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token=END, pad_token="<|endoftext|>",
                                  model_max_length=4096)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def _examples(tok: Any, convs: list[dict[str, Any]]) -> list[tuple[list[int], int]]:
    """Each conversation's ids and where its last answer starts (only the answer is trained)."""
    out = []
    for c in convs:
        prompt = tok.apply_chat_template(c["messages"], tools=c["tools"], add_generation_prompt=True, tokenize=False)
        whole = tok.apply_chat_template([*c["messages"], assistant_message(c)], tools=c["tools"], tokenize=False)
        assert whole.startswith(prompt), "the template's prompt is not a prefix of its whole"
        ids = tok.encode(whole.rstrip("\n"), add_special_tokens=False)[:MAX_LEN]
        out.append((ids, min(len(tok.encode(prompt, add_special_tokens=False)), len(ids) - 1)))
    return out


def _train(tok: Any, examples: list[tuple[list[int], int]], seed: int, steps: int) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    # 4 layers: the fewest `extraction.layers: auto` (EAGLE-3's low/middle/high) accepts
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         bos_token_id=None)
    torch.manual_seed(seed)  # in build's own process
    model = LlamaForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    g = torch.Generator().manual_seed(seed)
    by_length = sorted(examples, key=lambda e: len(e[0]))
    model.train()
    for step in range(steps):
        lr = 3e-3 * min(1.0, (step + 1) / 40) * 0.5 * (1 + math.cos(math.pi * step / steps))
        for group in opt.param_groups:
            group["lr"] = lr
        first = int(torch.randint(0, len(examples) - BATCH + 1, (1,), generator=g))
        batch = by_length[first:first + BATCH]  # neighbours in length: little padding
        width = max(len(ids) for ids, _ in batch)
        x = torch.full((BATCH, width), tok.pad_token_id)
        labels = torch.full((BATCH, width), -100)
        mask = torch.zeros((BATCH, width), dtype=torch.long)
        for b, (ids, start) in enumerate(batch):
            x[b, :len(ids)] = torch.tensor(ids)
            labels[b, start:len(ids)] = torch.tensor(ids[start:])
            mask[b, :len(ids)] = 1
        loss = model(input_ids=x, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def quantize(model: Any, kind: str) -> None:
    """Every Linear weight but the (tied) LM head rounded as a quantized provider serves it: `int8`
    (symmetric, one scale per output channel) or `fp8` (float8_e4m3fn, one scale per output channel),
    stored back dequantized (the scores compare what the arithmetic did, not the storage)."""
    import torch

    if kind not in ("int8", "fp8"):
        raise ValueError(f"quantize: {kind!r} is not int8 or fp8")
    head = model.get_output_embeddings().weight
    with torch.no_grad():
        for m in model.modules():
            if not isinstance(m, torch.nn.Linear) or m.weight is head:
                continue
            w = m.weight.float()
            if kind == "int8":
                scale = w.abs().amax(1, keepdim=True).clamp(min=1e-12) / 127
                q = (w / scale).round().clamp(-127, 127)
            else:
                scale = w.abs().amax(1, keepdim=True).clamp(min=1e-12) / torch.finfo(torch.float8_e4m3fn).max
                q = (w / scale).to(torch.float8_e4m3fn).float()
            m.weight.copy_((q * scale).to(m.weight.dtype))


# What a build's arithmetic depends on, pinned in the process that trains (set before torch loads): one
# thread, and the AVX2 kernels of torch (ATen), of MKL (its conditional numerical reproducibility mode)
# and of oneDNN, which x86-64 CPUs of the last decade all run, instead of whatever each CPU runs fastest
# (on this AMD EPYC, AVX-512 kernels train a model whose weights differ by up to 39% of a tensor's range).
BUILD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2",
             "ONEDNN_MAX_CPU_ISA": "AVX2"}


def build(folder: str | Path, seed: int = 0, steps: int = STEPS) -> Path:
    """Train the model (`seed`) and write it with its tokenizer into `folder`: in a child process with
    BUILD_ENV (kernels are chosen when torch loads, so only a fresh process can pin them; the caller's
    torch is left as it was)."""
    cmd = [sys.executable, "-m", "eyrie.jobs.extract.tiny", "build", str(folder), "--seed", str(seed),
           "--steps", str(steps)]
    r = subprocess.run(cmd, env={**os.environ, **BUILD_ENV}, stdin=subprocess.DEVNULL, capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise BuiltinModelError(f"building a tiny chat model into {folder} failed: {r.stderr[-3000:]}")
    return Path(folder)


def build_platform() -> dict[str, Any]:
    """What `build`'s bits depend on here, as its child process sees it (the CPU, the versions of the
    libraries that compute, the kernels torch picked under BUILD_ENV): recorded in MANIFEST.json."""
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.extract.tiny", "platform"], env={**os.environ, **BUILD_ENV},
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def _platform_here() -> dict[str, Any]:
    import platform

    import tokenizers
    import torch
    import transformers

    cpu: dict[str, str] = {}
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = (x.strip() for x in line.partition(":"))
            if key in ("vendor_id", "model name", "cpu family", "model", "stepping") and key not in cpu:
                cpu[key] = value
    return {"machine": platform.machine(), "cpu": cpu, "torch": torch.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
            "cpuCapability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
            "env": {k: os.environ.get(k) for k in BUILD_ENV}}


def _build_here(folder: Path, seed: int, steps: int) -> None:
    """`build`'s child (this process is its own: torch's settings are its to set)."""
    import torch

    torch.set_num_threads(1)
    convs = corpus(3000)
    tok = _tokenizer(_render([*c["messages"], assistant_message(c)], c["tools"]) for c in convs)
    model = _train(tok, _examples(tok, convs), seed, steps)
    folder.mkdir(parents=True, exist_ok=True)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(folder)
    tok.save_pretrained(folder)


def weights_sha256(tensors: dict[str, Any]) -> str:
    """A digest of named tensors (names, dtypes, shapes, bytes) that does not depend on how a file
    lays them out: the check of a derived model's weights, whatever wrote its file."""
    import torch

    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _check_derived(name: str, folder: Path) -> None:
    from safetensors.torch import load_file

    want = manifest()["models"][name]["weightsSha256"]

    def check() -> None:
        got = weights_sha256(load_file(folder / WEIGHTS))
        if got != want:
            raise BuiltinModelError(f"{name}: the weights in {folder / WEIGHTS} have digest {got}, MANIFEST.json "
                                    f"says {want}: delete {folder} to derive it again from the shipped tiny-chat")

    check_once(folder, check)


def derive(src: Path, folder: Path, kind: str) -> Path:
    """The model in `src` with its weights rounded (`quantize`) into `folder`: its weights written anew,
    every other file (config, tokenizer, template) copied byte for byte."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    quantize(model, kind)
    folder.mkdir(parents=True, exist_ok=True)
    scratch = folder / ".weights"
    model.save_pretrained(scratch)
    (scratch / WEIGHTS).replace(folder / WEIGHTS)
    shutil.rmtree(scratch)
    for f in src.iterdir():
        if f.is_file() and f.name != WEIGHTS:
            shutil.copyfile(f, folder / f.name)
    return folder


_BUILD_LOCK = threading.RLock()


def model_folder(name: str) -> Path:
    """The folder of `builtin:tiny-chat` or one of its impostors (NAMES): a shipped one's files
    checked against the manifest, a derived one derived into the cache on first use and checked."""
    from eyrie.jobs.cache import models_dir

    if name not in NAMES:
        raise ExtractionError(f"unknown builtin chat model {name!r}; known: {', '.join(NAMES)}")
    if name in TRAINED:
        return check_shipped(name)
    src = check_shipped(NAMES[0])
    kind = DERIVED[name]
    # keyed by the shipped weights: a cache derived from other weights (an older eyrie's) is never taken
    base = manifest()["models"][NAMES[0]]["files"][WEIGHTS][:12]
    folder = models_dir() / f"tiny-chat-v{VERSION}-{base}-{kind}"
    if not (folder / "config.json").exists():
        folder.parent.mkdir(parents=True, exist_ok=True)
        # one builder per machine (a simulator and an extraction starting together wait for one build)
        with _BUILD_LOCK, open(folder.with_name(folder.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (folder / "config.json").exists():
                tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}-{threading.get_ident()}")
                try:
                    _check_derived(name, derive(src, tmp, kind))
                    tmp.replace(folder)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
                check_once(folder, lambda: None)  # derived and checked just now
    _check_derived(name, folder)
    return folder


# ------------------------------------------------------------------------------- decoding

_LOADED: dict[str, tuple[Any, int, threading.Lock]] = {}
_LOAD_LOCK = threading.Lock()


def _load(folder: str | Path) -> tuple[Any, int, threading.Lock]:
    key = str(Path(folder).resolve())
    with _LOAD_LOCK:
        if key not in _LOADED:
            import torch
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(key, dtype=torch.float32).eval()
            _LOADED[key] = (model, int(model.generation_config.eos_token_id), threading.Lock())
        return _LOADED[key]


def preload(folder: str | Path) -> None:
    """Load the model's weights now rather than at the first decode (torch and transformers' import
    and the load take ~10 s of a loaded 2-core machine): a server can do it before its first request."""
    _load(folder)


def decode(folder: str | Path, prompt_ids: list[int], max_new_tokens: int, temperature: float = 0.0,
           seed: int = 0) -> list[int]:
    """The model's answer to `prompt_ids` (ending with its end-of-turn id unless cut at
    `max_new_tokens`): greedy at temperature 0, else sampled from a generator seeded with `seed`.
    KV-cached, on CPU; one decode per model at a time (callers on several threads wait). Token by
    token the work is too small to share: a process that only decodes is fastest with
    `torch.set_num_threads(1)` (on a loaded machine several threads spin against each other), which
    that process sets (the simulator's own does); decode leaves the caller's setting as it is."""
    import torch

    model, eos, lock = _load(folder)
    g = torch.Generator().manual_seed(seed)
    out: list[int] = []
    with lock, torch.inference_mode():
        step = model(torch.tensor([prompt_ids]), use_cache=True)
        for _ in range(max_new_tokens):
            logits = step.logits[0, -1].float()
            if temperature > 0:
                nxt = int(torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=g))
            else:
                nxt = int(logits.argmax())
            out.append(nxt)
            if nxt == eos:
                break
            step = model(torch.tensor([[nxt]]), past_key_values=step.past_key_values, use_cache=True)
    return out


def _main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m eyrie.jobs.extract.tiny", description="build's child process (and "
                                "what it computes on: `platform`)")
    p.add_argument("command", choices=["build", "platform"])
    p.add_argument("folder", type=Path, nargs="?")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=STEPS)
    a = p.parse_args(argv)
    if a.command == "platform":
        print(json.dumps(_platform_here()))
    elif a.folder is None:
        p.error("build needs a folder")
    else:
        _build_here(a.folder, a.seed, a.steps)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
