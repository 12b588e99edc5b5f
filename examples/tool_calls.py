"""Tool calls through the official `openai` client: a streamed call assembled from its
deltas, a named call, Pydantic-parsed arguments, and a call and its result sent back.

    pip install openai jsonschema
    python3 examples/tool_calls.py --base-url http://127.0.0.1:8000/v1

Works on the random-weight demo: with tool_choice "required" or a named function the
grammar, not the model, makes the call valid. Exits non-zero if anything looks wrong,
so tests can run it.
"""
import argparse
import json
import sys
from typing import Literal

import jsonschema
import openai
from openai import OpenAI
from pydantic import BaseModel, Field


class GetWeather(BaseModel):
    """The current weather in a city."""

    city: str = Field(max_length=10)
    unit: Literal["celsius", "fahrenheit"]


TIME_PARAMETERS = {
    "type": "object",
    "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    openai.pydantic_function_tool(GetWeather, name="get_weather"),
    {"type": "function", "function": {"name": "get_time", "description": "Local time in a UTC offset.",
                                      "parameters": TIME_PARAMETERS}},
]
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
QUESTION = [{"role": "user", "content": "What is the weather in Paris, and the time there?"}]


def fail(message: str) -> int:
    print(message, file=sys.stderr)
    return 1


def validate(name: str, arguments: str) -> None:
    if name not in SCHEMAS:
        raise ValueError(f"a call to {name}, which is not a tool")
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


def check_streamed(client: OpenAI, model: str) -> int:
    calls = {}
    finish = None
    for seed in range(3):
        calls.clear()
        stream = client.chat.completions.create(model=model, messages=QUESTION, tools=TOOLS, tool_choice="required",
                                                max_tokens=200, temperature=0.9, seed=seed, stream=True)
        for chunk in stream:
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            finish = choice.finish_reason or finish
            for part in choice.delta.tool_calls or []:
                call = calls.setdefault(part.index, {"id": part.id, "name": part.function.name, "arguments": ""})
                call["arguments"] += part.function.arguments or ""
        if not calls or finish != "tool_calls":
            return fail(f"seed {seed}: no call streamed (finish {finish}): {calls}")
        for call in calls.values():
            try:
                validate(call["name"], call["arguments"])
            except (ValueError, jsonschema.ValidationError) as e:
                return fail(f"seed {seed}: {e}: {call}")
    print(f"streamed call: {calls[0]['name']}({calls[0]['arguments']}), id {calls[0]['id']}")
    return 0


def check_named(client: OpenAI, model: str) -> int:
    completion = client.chat.completions.create(
        model=model, messages=QUESTION, tools=TOOLS, max_tokens=200, temperature=0.9, seed=7,
        tool_choice={"type": "function", "function": {"name": "get_time"}}, parallel_tool_calls=False)
    message = completion.choices[0].message
    if completion.choices[0].finish_reason != "tool_calls" or len(message.tool_calls or []) != 1:
        return fail(f"named choice: {completion}")
    call = message.tool_calls[0]
    if call.function.name != "get_time":
        return fail(f"named get_time, got {call.function.name}")
    validate(call.function.name, call.function.arguments)
    print(f"named call: {call.function.name}({call.function.arguments})")
    return check_round_trip(client, model, message)


def check_round_trip(client: OpenAI, model: str, message) -> int:
    call = message.tool_calls[0]
    history = QUESTION + [message.model_dump(exclude_none=True),
                          {"role": "tool", "tool_call_id": call.id, "content": "14:05"}]
    completion = client.chat.completions.create(model=model, messages=history, tools=TOOLS, tool_choice="none",
                                                max_tokens=8, seed=1)
    if completion.choices[0].message.tool_calls or not isinstance(completion.choices[0].message.content, str):
        return fail(f"tool_choice none after a round trip: {completion}")
    print(f"round trip: {completion.usage.prompt_tokens} prompt tokens with the call and its result")
    return 0


def check_parsed(client: OpenAI, model: str) -> int:
    completion = client.beta.chat.completions.parse(
        model=model, messages=QUESTION, tools=[openai.pydantic_function_tool(GetWeather, name="get_weather")],
        tool_choice="required", parallel_tool_calls=False, max_tokens=200, temperature=0.9, seed=5)
    arguments = completion.choices[0].message.tool_calls[0].function.parsed_arguments
    if not isinstance(arguments, GetWeather):
        return fail(f"parsed_arguments is {arguments!r}")
    print(f"parsed arguments: {arguments!r}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key", default="none")
    parser.add_argument("--model", default=None, help="model id; the first listed when omitted")
    args = parser.parse_args()
    client = OpenAI(base_url=args.base_url, api_key=args.api_key)
    model = args.model or client.models.list().data[0].id
    for check in (check_streamed, check_named, check_parsed):
        if check(client, model):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
