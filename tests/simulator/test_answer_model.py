"""`api.simulator.answerModel`: the simulated provider serves the text a builtin chat model writes
(checked against the model's own greedy decoding, read with transformers' tokenizer and template),
keeps its scripted decision of whether to call a tool, takes the model's calls when they validate,
and counts usage as the tokens of what it served; with `answerModelCalls: model` the model decides
its calls too, structured and with the functions described as text."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from eyrie.jobs.simulator import SimulatorConfig, make_answer

CHAT = "builtin:tiny-chat"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}
TOPICS = ("the water cycle", "photosynthesis", "binary search", "black holes", "compound interest", "tides")
CITIES = ("Paris", "Lagos", "Osaka", "Lima", "Oslo", "Austin", "Hanoi", "Quito", "Perth", "Cairo")


@pytest.fixture(scope="module")
def model():
    """The model's folder and transformers' own tokenizer for it (built once into the cache)."""
    from transformers import AutoTokenizer

    from eyrie.jobs.extract import tiny

    folder = tiny.model_folder(CHAT)
    return folder, AutoTokenizer.from_pretrained(folder)


def request(messages, **extra):
    return {"model": "eyrie/tiny-chat", "messages": messages, "temperature": 0, "max_tokens": 256,
            "reasoning": {"effort": "high"}, **extra}


async def ask(sim, body):
    async with aiohttp.ClientSession() as s, s.post(sim.base_url + "/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        return await r.json()


def config(answer_model=CHAT, **kw):
    return dict(tokenizer=CHAT, chat_format="auto", answer_model=answer_model, **kw)


async def test_the_served_text_is_the_models_greedy_answer(start_sim, model):
    from eyrie.jobs.extract import tiny

    folder, hf = model
    sim = await start_sim(**config())
    for topic in TOPICS:
        messages = [{"role": "system", "content": "You are a concise tutor."},
                    {"role": "user", "content": f"Explain {topic} in three sentences."}]
        doc = await ask(sim, request(messages))
        msg, usage = doc["choices"][0]["message"], doc["usage"]
        prompt = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        greedy = hf.decode(tiny.decode(folder, hf.encode(prompt, add_special_tokens=False), 256))
        served = f"<think>\n{msg['reasoning']}\n</think>\n\n{msg['content']}<|im_end|>"
        assert served == greedy, topic  # every character is the model's own, in its own template
        assert doc["choices"][0]["finish_reason"] == "stop"
        assert usage["completion_tokens"] == len(hf.encode(greedy, add_special_tokens=False))
        assert usage["prompt_tokens"] == len(hf.encode(prompt, add_special_tokens=False))


def models_own_calls(folder, hf, messages, tools) -> list[dict] | None:
    """The calls the loaded model writes after its reasoning when it answers greedily, as (name,
    arguments) functions, if every one is a valid call of a declared tool; [] if it writes none or an
    invalid one; None where it strays into a call before closing its reasoning (the simulator then
    closes it and asks again: not predicted here)."""
    from eyrie.jobs.extract import tiny
    from eyrie.jobs.simulator.answers import STRAYS, THINK_END
    from eyrie.jobs.tools.textcalls import parse_hermes
    from eyrie.jobs.tools.validation import ToolValidator

    prompt = hf.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    text = hf.decode(tiny.decode(folder, hf.encode(prompt, add_special_tokens=False), 256))
    close = text.find(THINK_END)
    if close < 0 or any(0 <= text.find(m) < close for m in STRAYS):
        return None
    found = parse_hermes(text[close + len(THINK_END):])
    if not found or not all(v.valid for v in ToolValidator.for_tools(tools).check_text_calls(found)):
        return []
    return [{"name": c.name, "arguments": c.arguments} for c in found]


async def test_tool_calls_keep_the_simulators_rate_and_are_the_models_own_when_valid(start_sim, model):
    """Whether an answer calls is the simulator's draw; what it calls is what the model loaded here
    writes (asked directly, greedily) where that is a valid call, else the simulator's script. Which
    prompts the model answers with a valid call is its own property (it differs between models of
    the same recipe trained on other CPUs), so it is read from the model, not written down."""
    import json

    folder, hf = model
    sim = await start_sim(**config())
    scripted = SimulatorConfig()
    own = called = predicted = 0
    for city in CITIES:
        messages = [{"role": "user", "content": f"What's the weather like in {city} right now?"}]
        body = request(messages, tools=[WEATHER])
        doc = await ask(sim, body)
        calls = doc["choices"][0]["message"].get("tool_calls") or []
        plan = make_answer(body, scripted).tool_calls  # the simulator's own decision, without a model
        assert bool(calls) == bool(plan), city
        if not calls:
            continue
        called += 1
        served = [{"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])} for c in calls]
        script = [{"name": p["function"]["name"], "arguments": json.loads(p["function"]["arguments"])} for p in plan]
        expected = models_own_calls(folder, hf, messages, [WEATHER])
        if expected is None:  # reasoning not closed by the model: served is either, and valid
            assert served == script or {c["name"] for c in served} == {"get_weather"}, city
            own += served != script
            continue
        predicted += 1
        assert served == (expected or script), city
        own += bool(expected)
    assert called >= 5 and predicted >= 5  # the simulator's rate (0.8 of 10); the model closes its reasoning
    assert own >= 1, "the loaded model writes no valid call of its own: the test would not see the model's calls"


async def test_an_impostor_writes_other_text_and_sampling_is_seeded(start_sim, model):
    native, impostor = await start_sim(**config()), await start_sim(**config("builtin:tiny-chat-seed1"))
    differ = 0
    for topic in TOPICS:
        body = request([{"role": "user", "content": f"Explain {topic} in three sentences."}])
        a, b = await ask(native, body), await ask(impostor, body)
        differ += a["choices"][0]["message"]["content"] != b["choices"][0]["message"]["content"]
    assert differ >= len(TOPICS) - 1
    body = request([{"role": "user", "content": "Explain tides in three sentences."}], temperature=1.5)
    first, again = await ask(native, body), await ask(native, body)
    greedy = await ask(native, {**body, "temperature": 0})
    assert first["choices"][0]["message"] == again["choices"][0]["message"]  # seeded by the prompt
    assert first["choices"][0]["message"]["content"] != greedy["choices"][0]["message"]["content"]


def _greedy(hf, folder, messages, tools=None, limit=256, prefix=""):
    from eyrie.jobs.extract import tiny

    prompt = hf.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False) + prefix
    return hf.decode(tiny.decode(folder, hf.encode(prompt, add_special_tokens=False), limit))


def _as_served(hf, folder, messages, tools=None, limit=256):
    """The loaded model's greedy answer as the simulator serves it (docs/operating.md): its reasoning up
    to its own `</think>`; where it never closes it before straying into a call or the limit (the shipped
    tiny-chat, sent the functions as text, writes spaces to the limit), the simulator closes it there and
    the model goes on from after it (in half the limit)."""
    from eyrie.jobs.simulator.answers import STRAYS, THINK, THINK_END

    text = _greedy(hf, folder, messages, tools, limit)
    close = text.find(THINK_END)
    stray = min((i for m in STRAYS if (i := text.find(m)) >= 0), default=len(text))
    if 0 <= close < stray:
        return text
    reasoning = text[len(THINK):stray].removeprefix("\n").strip("\n")
    prefix = f"{THINK}\n{reasoning}\n{THINK_END}\n\n"
    return prefix + _greedy(hf, folder, messages, tools, limit // 2, prefix).lstrip("\n")


async def test_when_the_model_decides_its_calls_are_its_own_blocks_structured_and_its_text_as_text(start_sim,
                                                                                                     model):
    """answerModelCalls: model. With `tools`, the served calls are exactly the `<tool_call>` blocks of
    the model's greedy answer, none where it writes none (the simulator's 0.8 draw plays no part);
    with the functions described in the system prompt, the served answer is the model's greedy text
    verbatim, whatever it writes (a call as text or prose), its reasoning closed by the simulator
    where the model does not close it (`_as_served`)."""
    from eyrie.jobs.tools.declarations import render_text_declarations
    from eyrie.jobs.tools.textcalls import parse_hermes

    folder, hf = model
    sim = await start_sim(**config(answer_model_calls="model"))
    scripted = SimulatorConfig()
    overruled = 0
    for city in CITIES:
        messages = [{"role": "user", "content": f"What's the weather like in {city} right now?"}]
        body = request(messages, tools=[WEATHER])
        choice = (await ask(sim, body))["choices"][0]
        served = [(c["function"]["name"], orjson.loads(c["function"]["arguments"]))
                  for c in choice["message"].get("tool_calls") or []]
        answer = _as_served(hf, folder, messages, [WEATHER]).split("</think>", 1)[-1]
        assert served == [(c.name, c.arguments) for c in parse_hermes(answer)], city
        assert choice["finish_reason"] in (("tool_calls",) if served else ("stop", "length"))
        overruled += bool(served) != bool(make_answer(body, scripted).tool_calls)  # the draw it ignores
        text_messages = [{"role": "system", "content": render_text_declarations([WEATHER])}, *messages]
        choice = (await ask(sim, request(text_messages)))["choices"][0]
        msg = choice["message"]
        assert not msg.get("tool_calls")
        end = "<|im_end|>" if choice["finish_reason"] == "stop" else ""
        served_text = f"<think>\n{msg['reasoning']}\n</think>\n\n{msg['content'] or ''}{end}"
        assert served_text == _as_served(hf, folder, text_messages), city
    assert overruled >= 1  # the simulator's 0.8 draw would have decided otherwise somewhere


def test_the_spec_needs_the_models_tokenizer_for_an_answer_model():
    from pydantic import ValidationError

    from eyrie.jobs.spec import DatasetGenerationSpec

    spec = {"sources": [{"name": "p", "uri": "p.jsonl"}], "target": {"model": "m"},
            "api": {"baseUrl": "simulated", "simulator": {"answerModel": CHAT}},
            "budget": {"maxUSD": "1"}, "extraction": {"enabled": False}, "output": {"uri": "/tmp/x"}}
    with pytest.raises(ValidationError, match=r"api\.simulator\.answerModel: needs target\.tokenizer"):
        DatasetGenerationSpec.model_validate(spec)
    spec["api"]["simulator"]["answerModel"] = "builtin:gpt-5"
    with pytest.raises(ValidationError, match=r"answer_?[mM]odel"):
        DatasetGenerationSpec.model_validate({**spec, "target": {"model": "m", "tokenizer": CHAT}})
