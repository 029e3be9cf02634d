"""The official `anthropic` client against a real `engram serve`:
`messages.count_tokens` counts the prompt `messages.create` renders.

`.ci/run` installs `anthropic`; elsewhere these tests skip without it (and fail under
CI=true)."""

import os

import pytest

try:
    import anthropic
except ImportError:
    if os.environ.get("CI") == "true":
        pytest.fail("the `anthropic` client is not installed (.ci/run installs it: pip install anthropic)", pytrace=False)
    pytest.skip("the `anthropic` client is not installed: pip install anthropic", allow_module_level=True)


@pytest.fixture
def client(server):
    return anthropic.Anthropic(base_url=server["base"], api_key="x", max_retries=0)


def test_count_tokens_is_the_prompt_messages_renders(client, server):
    msgs = [{"role": "user", "content": "How many tokens is this?"}]
    n = client.messages.count_tokens(model=server["model"], system="Be terse.", messages=msgs).input_tokens
    assert n > 0
    r = client.messages.create(model=server["model"], max_tokens=2, system="Be terse.", messages=msgs)
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens == n
    longer = client.messages.count_tokens(
        model=server["model"], system="Be terse.",
        messages=msgs + [{"role": "assistant", "content": "Some."}, {"role": "user", "content": "And now?"}])
    assert longer.input_tokens > n


def test_count_tokens_rejects_what_messages_rejects(client, server):
    with pytest.raises(anthropic.NotFoundError):
        client.messages.count_tokens(model="claude-9", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.count_tokens(model=server["model"], messages=[])
    assert "messages" in str(e.value)
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.count_tokens(
            model=server["model"], messages=[{"role": "user", "content": "hi"}],
            tools=[{"name": "f", "description": "d", "input_schema": {"type": "nonsense"}}])
    assert "tools[0].input_schema" in str(e.value)
