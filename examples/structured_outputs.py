"""Structured outputs, logit_bias, n choices and refusals through the official `openai` client.

    pip install openai jsonschema
    python3 examples/structured_outputs.py --base-url http://127.0.0.1:8000/v1

Works on the random-weight demo: the grammar, not the model, makes the output valid.
Exits non-zero if anything looks wrong, so tests can run it.
"""
import argparse
import json
import sys
from typing import List, Literal

import jsonschema
import openai
from openai import OpenAI
from pydantic import BaseModel, Field


class Pet(BaseModel):
    name: str = Field(max_length=8)
    age: int = Field(ge=0, le=30)
    kind: Literal["cat", "dog", "fish"]
    tags: List[Literal["old", "young", "loud"]] = Field(max_length=2)


# Nested objects, arrays, enums, bounded numbers, required and optional fields.
SCHEMAS = [
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False},
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 10},
            "population": {"type": "integer", "minimum": 0, "maximum": 100000},
            "coastal": {"type": "boolean"},
        },
        "required": ["city", "population"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "scores": {
                "type": "array",
                "items": {"type": "integer", "minimum": -10, "maximum": 10},
                "minItems": 1,
                "maxItems": 4,
            }
        },
        "required": ["scores"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "owner": {
                "type": "object",
                "properties": {
                    "first": {"type": "string", "maxLength": 6},
                    "level": {"enum": ["junior", "senior"]},
                },
                "required": ["first", "level"],
                "additionalProperties": False,
            },
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"sku": {"enum": ["a1", "b2"]}, "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
                    "required": ["sku", "qty"],
                    "additionalProperties": False,
                },
                "maxItems": 2,
            },
        },
        "required": ["owner", "items"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "ratio": {"type": "number", "minimum": 0, "maximum": 1},
            "label": {"type": ["string", "null"], "maxLength": 5},
        },
        "required": ["ratio"],
        "additionalProperties": False,
    },
]


def fail(message: str) -> int:
    print(message, file=sys.stderr)
    return 1


def check_parse(client: OpenAI, model: str) -> int:
    completion = client.beta.chat.completions.parse(
        model=model,
        messages=[{"role": "user", "content": "Describe a pet."}],
        response_format=Pet,
        max_tokens=200,
        temperature=0.8,
        seed=3,
    )
    pet = completion.choices[0].message.parsed
    if not isinstance(pet, Pet):
        return fail(f"parse returned {pet!r}: {completion.choices[0].message.content!r}")
    print(f"parsed: {pet!r}")
    return 0


def check_schemas(client: OpenAI, model: str, rounds: int) -> int:
    checked = 0
    for seed in range(rounds):
        for i, schema in enumerate(SCHEMAS):
            for stream in (False, True):
                content = constrained(client, model, schema, seed * 10 + i, stream)
                try:
                    jsonschema.validate(json.loads(content), schema)
                except (ValueError, jsonschema.ValidationError) as e:
                    return fail(f"schema {i}, seed {seed}, stream {stream}: {e}: {content!r}")
                checked += 1
    print(f"validated {checked} outputs against {len(SCHEMAS)} schemas")
    return 0


def constrained(client: OpenAI, model: str, schema: dict, seed: int, stream: bool) -> str:
    format = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
    args = dict(model=model, messages=[{"role": "user", "content": "JSON please."}], response_format=format,
                max_tokens=300, temperature=0.9, seed=seed)
    if not stream:
        choice = client.chat.completions.create(**args).choices[0]
        assert choice.finish_reason == "stop", choice
        return choice.message.content
    text = ""
    for chunk in client.chat.completions.create(stream=True, **args):
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    return text


def check_logit_bias(client: OpenAI, model: str) -> int:
    token = 1000
    completion = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Anything."}],
        logit_bias={str(token): 100},
        max_tokens=4,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    ids = completion.choices[0].model_extra.get("token_ids")
    if ids != [token] * 4:
        return fail(f"logit_bias +100 on {token}: got {ids}")
    print(f"logit_bias: greedy output is token {token} every time")
    return 0


def check_choices(client: OpenAI, model: str) -> int:
    args = dict(model=model, messages=[{"role": "user", "content": "Say something."}], max_tokens=6,
                temperature=0.9, extra_body={"ignore_eos": True})
    completion = client.chat.completions.create(n=3, seed=40, **args)
    texts = [c.message.content for c in sorted(completion.choices, key=lambda c: c.index)]
    if len(texts) != 3:
        return fail(f"n=3 gave {len(texts)} choices")
    for i, text in enumerate(texts):
        alone = client.chat.completions.create(n=1, seed=40 + i, **args).choices[0].message.content
        if alone != text:
            return fail(f"choice {i} is not the n=1 output of seed {40 + i}: {text!r} vs {alone!r}")
    print(f"n = 3: three choices, each the n = 1 output of seed 40 + i")
    return 0


def check_refusals(client: OpenAI, model: str) -> int:
    cases = [
        ("suffix", lambda: client.completions.create(model=model, prompt="a", suffix="b", max_tokens=2)),
        ("messages[0].role", lambda: client.chat.completions.create(
            model=model, messages=[{"role": "wizard", "content": "hi"}], max_tokens=2)),
        ("response_format.type", lambda: client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
            response_format={"type": "xml"})),
    ]
    for param, call in cases:
        try:
            call()
        except openai.BadRequestError as e:
            if e.body.get("param") != param:
                return fail(f"refused {param}, but the error names {e.body!r}")
            continue
        return fail(f"{param} was accepted")
    print(f"refused by name: {', '.join(p for p, _ in cases)}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key", default="none")
    parser.add_argument("--model", default=None, help="model id; the first listed when omitted")
    parser.add_argument("--rounds", type=int, default=3, help="seeds per schema")
    args = parser.parse_args()
    client = OpenAI(base_url=args.base_url, api_key=args.api_key)
    model = args.model or client.models.list().data[0].id
    for check in (check_parse, check_logit_bias, check_choices, check_refusals):
        if check(client, model):
            return 1
    return check_schemas(client, model, args.rounds)


if __name__ == "__main__":
    sys.exit(main())
