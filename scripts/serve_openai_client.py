"""The official `openai` Python client against a running `ferrite serve` (or any
OpenAI-compatible server): chat and text completions, streamed and not, usage, logprobs, `n`,
JSON-schema output (`response_format` from a pydantic model: the reply must parse and
validate, its keys in schema order), and the client's error type for a 400. Driven by `cargo test -p ferrite-serve --test http
openai_python_client` (skipped when python3 or `openai` is missing).

Usage: python3 scripts/serve_openai_client.py http://127.0.0.1:8080 [API_KEY]
Exits non-zero with a message on the first check that fails.
"""

import json
import sys
from typing import Annotated, List

import openai
from pydantic import BaseModel, Field


class User(BaseModel):
    """Every size bounded, so any valid reply fits the test server's context."""

    name: str = Field(min_length=1, max_length=24)
    age: int
    languages: List[Annotated[str, Field(max_length=12)]] = Field(min_length=1, max_length=3)
    admin: bool


def main():
    base = sys.argv[1].rstrip("/") + "/v1"
    key = sys.argv[2] if len(sys.argv) > 2 else "none"
    client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120)

    models = client.models.list()
    model = models.data[0].id
    assert model, "no model in /v1/models"

    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Say hello in French."},
    ]
    chat = client.chat.completions.create(
        model=model, messages=messages, max_tokens=10, seed=3, temperature=0.7
    )
    choice = chat.choices[0]
    assert choice.message.role == "assistant", choice
    assert isinstance(choice.message.content, str) and choice.message.content, choice
    assert choice.finish_reason in ("stop", "length"), choice.finish_reason
    u = chat.usage
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens, u
    assert 1 <= u.completion_tokens <= 10, u

    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=10,
        seed=3,
        temperature=0.7,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                text += c.delta.content
            if c.finish_reason:
                finish = c.finish_reason
    assert text == choice.message.content, (text, choice.message.content)
    assert finish == choice.finish_reason, (finish, choice.finish_reason)
    assert usage is not None and usage.completion_tokens == u.completion_tokens, usage

    comp = client.completions.create(
        model=model, prompt="The capital of France is", max_tokens=6, temperature=0
    )
    ctext = comp.choices[0].text
    assert isinstance(ctext, str) and ctext, comp
    assert comp.usage.completion_tokens <= 6, comp.usage
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=model,
            prompt="The capital of France is",
            max_tokens=6,
            temperature=0,
            stream=True,
        )
        if c.choices
    )
    assert streamed == ctext, (streamed, ctext)

    lp = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=3,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = lp.choices[0].logprobs.content
    assert len(content) >= 1 and len(content[0].top_logprobs) == 2, content
    assert content[0].logprob <= 0.0, content[0]

    schema = User.model_json_schema()
    for seed in (1, 2):
        js = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Make up a user profile."}],
            max_tokens=200,
            temperature=1.0,
            seed=seed,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "user", "schema": schema, "strict": True},
            },
        )
        reply = js.choices[0].message.content
        assert js.choices[0].finish_reason == "stop", (js.choices[0].finish_reason, reply)
        user = User.model_validate_json(reply)
        assert list(json.loads(reply)) == list(User.model_fields), reply
        assert user.name, reply

    many = client.chat.completions.create(
        model=model, messages=messages, max_tokens=4, seed=5, temperature=1.0, n=3
    )
    assert [c.index for c in many.choices] == [0, 1, 2], many.choices
    mu = many.usage
    assert 3 <= mu.completion_tokens <= 12, mu
    assert mu.total_tokens == mu.prompt_tokens + mu.completion_tokens, mu

    try:
        client.chat.completions.create(
            model=model, messages=messages, max_tokens=3, temperature=5
        )
        raise AssertionError("temperature 5 was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400, e
        assert "temperature" in str(e), e

    try:
        client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=3,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "string", "format": "email"}},
            },
        )
        raise AssertionError("an unsupported schema keyword was accepted")
    except openai.BadRequestError as e:
        assert "format" in str(e), e

    print(
        f"openai {openai.__version__}: chat, streaming, completions, logprobs, n, json_schema and errors ok"
    )


if __name__ == "__main__":
    main()
