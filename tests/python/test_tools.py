"""Tool calling with the official clients on the real SmolLM2-135M-Instruct (its ChatML template
has no tool support, so the server describes the tools in a system message and binds the answer
to JSON: the generic format). Greedy, over a real `engram serve` on loopback:

- `openai`: a tool loop with two tools over three turns; every call's arguments are valid
  against its tool's schema (`jsonschema`), and each turn reuses the cache of the last
  (`usage.prompt_tokens_details.cached_tokens` at least the previous prompt); the streamed
  tool-call deltas reassemble to the non-streamed call.
- `anthropic`: tool use (whole and streamed), the `tool_result` turn, cache reads growing, and
  `messages.count_tokens` counting the tools.
- `ollama`: `tools` on `/api/chat`, calls with object arguments, a `tool` message in the history.
"""

import json

import jsonschema
import pytest

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer", "minimum": -1000, "maximum": 1000},
                   "b": {"type": "integer", "minimum": -1000, "maximum": 1000}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
OPENAI_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": ADD}},
]
SYSTEM = "You are a helpful assistant that uses tools."


@pytest.fixture
def smollm2(real_model):
    return real_model["base"]


def valid(name, args):
    assert name in SCHEMAS, name
    jsonschema.validate(args, SCHEMAS[name])


def test_openai_tool_loop_three_turns_valid_calls_and_a_growing_cache(smollm2):
    from openai import OpenAI

    client = OpenAI(base_url=smollm2 + "/v1", api_key="unused")
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "What is the weather in Paris, and what is 17 plus 25?"}]
    session = {"session_id": "py-tool-loop"}
    results = {"get_weather": '{"temperature": 18, "unit": "celsius"}', "add": "42"}
    last_prompt = 0
    for turn, choice in enumerate(["required", {"type": "function", "function": {"name": "add"}}, "none"]):
        r = client.chat.completions.create(model="default", messages=messages, tools=OPENAI_TOOLS, tool_choice=choice,
                                           parallel_tool_calls=False, temperature=0, max_tokens=60, extra_body=session)
        cached = r.usage.prompt_tokens_details.cached_tokens
        if turn > 0:
            assert cached >= last_prompt, f"turn {turn}: {cached} cached, the last prompt was {last_prompt} tokens"
        last_prompt = r.usage.prompt_tokens
        m = r.choices[0].message
        if choice == "none":
            assert not m.tool_calls and isinstance(m.content, str), m
            break
        assert r.choices[0].finish_reason == "tool_calls", r
        assert len(m.tool_calls) == 1, m
        call = m.tool_calls[0]
        assert call.id.startswith("call_") and call.type == "function"
        valid(call.function.name, json.loads(call.function.arguments))
        if isinstance(choice, dict):
            assert call.function.name == "add"
        messages.append({"role": "assistant", "content": None, "tool_calls": [call.model_dump()]})
        messages.append({"role": "tool", "tool_call_id": call.id, "content": results[call.function.name]})


def test_openai_streamed_tool_call_deltas_reassemble(smollm2):
    from openai import OpenAI

    client = OpenAI(base_url=smollm2 + "/v1", api_key="unused")
    kw = dict(model="default", tools=OPENAI_TOOLS, tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=60,
              messages=[{"role": "user", "content": "What is 2 plus 3?"}])
    whole = client.chat.completions.create(**kw).choices[0].message
    calls, finish = {}, None
    for chunk in client.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        for tc in c.delta.tool_calls or []:
            if tc.index not in calls:
                assert tc.id and tc.type == "function" and tc.function.name and tc.function.arguments == ""
                calls[tc.index] = [tc.function.name, ""]
            else:
                calls[tc.index][1] += tc.function.arguments or ""
        finish = c.finish_reason or finish
    assert finish == "tool_calls"
    got = [tuple(calls[i]) for i in sorted(calls)]
    assert got == [(t.function.name, t.function.arguments) for t in whole.tool_calls]
    for name, args in got:
        valid(name, json.loads(args))


def test_anthropic_tool_use_streamed_and_a_growing_cache(smollm2):
    import anthropic

    client = anthropic.Anthropic(base_url=smollm2, api_key="unused")
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in OPENAI_TOOLS]
    messages = [{"role": "user", "content": "What is the weather in Oslo?"}]
    extra = {"session_id": "py-anthropic-tools", "temperature": 0}
    counted = client.messages.count_tokens(model="default", messages=messages, tools=tools).input_tokens
    bare = client.messages.count_tokens(model="default", messages=messages).input_tokens
    assert counted > bare, (counted, bare)
    r = client.messages.create(model="default", max_tokens=60, messages=messages, tools=tools,
                               tool_choice={"type": "any", "disable_parallel_tool_use": True}, extra_body=extra)
    assert r.stop_reason == "tool_use", r
    uses = [b for b in r.content if b.type == "tool_use"]
    assert len(uses) == 1, r
    valid(uses[0].name, uses[0].input)
    first_prompt = r.usage.input_tokens + r.usage.cache_read_input_tokens
    with client.messages.stream(model="default", max_tokens=60, messages=messages, tools=tools,
                                tool_choice={"type": "any", "disable_parallel_tool_use": True}, extra_body=extra) as s:
        final = s.get_final_message()
    streamed = [b for b in final.content if b.type == "tool_use"]
    assert [(b.name, b.input) for b in streamed] == [(uses[0].name, uses[0].input)]
    messages += [{"role": "assistant", "content": [b.model_dump() for b in r.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "12 degrees"}]}]
    r2 = client.messages.create(model="default", max_tokens=40, messages=messages, tools=tools,
                                tool_choice={"type": "none"}, extra_body=extra)
    assert r2.usage.cache_read_input_tokens >= first_prompt, (r2.usage, first_prompt)
    assert r2.stop_reason in ("end_turn", "max_tokens") and r2.content[0].type == "text", r2


def test_ollama_chat_with_tools(smollm2):
    import ollama

    client = ollama.Client(host=smollm2)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is the weather in Rome?"}]
    r = client.chat(model="default", messages=messages, tools=OPENAI_TOOLS, options={"temperature": 0, "num_predict": 60})
    calls = r.message.tool_calls or []
    for c in calls:
        assert isinstance(c.function.arguments, dict)
        valid(c.function.name, dict(c.function.arguments))
    if not calls:
        assert isinstance(r.message.content, str) and r.message.content
    # A call and its result in the history (the form Ollama's clients send back).
    messages += [{"role": "assistant", "content": "",
                  "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Rome", "unit": "celsius"}}}]},
                 {"role": "tool", "content": "21 degrees", "tool_name": "get_weather"}]
    r2 = client.chat(model="default", messages=messages, tools=OPENAI_TOOLS, options={"temperature": 0, "num_predict": 40})
    assert r2.done and r2.done_reason in ("stop", "length")
    for c in r2.message.tool_calls or []:
        valid(c.function.name, dict(c.function.arguments))
