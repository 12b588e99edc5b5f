"""The official `openai` Python client against a tokenrouter server (the Responses API):
a response, a streamed response, structured output parsed into a Pydantic model, a forced
function call sent back with its output through `previous_response_id`, retrieving and
deleting a stored response, and refusals by name.

    pip install openai
    python3 examples/responses_client.py --base-url http://127.0.0.1:8000/v1

Works on the random-weight demo: a named tool_choice and a JSON schema make the grammar,
not the model, write the call and the structure. Exits non-zero if anything looks wrong,
so tests can run it.
"""
import argparse
import json
import sys

import openai
from pydantic import BaseModel, Field

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 10}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


class City(BaseModel):
    name: str = Field(max_length=12)
    population: int = Field(ge=0, le=99999)


def fail(message: str) -> int:
    print(message, file=sys.stderr)
    return 1


def check_response(client: openai.OpenAI, model: str) -> int:
    response = client.responses.create(model=model, instructions="Be brief.", input="Say hello.",
                                       max_output_tokens=16)
    if response.object != "response" or response.status not in ("completed", "incomplete"):
        return fail(f"response: {response!r}")
    if response.usage.output_tokens <= 0 or response.output[0].type != "message":
        return fail(f"response output: {response!r}")
    print(f"response: {response.usage.output_tokens} tokens, {response.status}: {response.output_text!r}")
    return 0


def check_stream(client: openai.OpenAI, model: str) -> int:
    kinds = []
    deltas = []
    final = None
    # The budget cuts random weights: the stream then ends with `response.incomplete`,
    # which `get_final_response()` does not accept, so the last event's response is read.
    with client.responses.stream(model=model, input="Count to three.", max_output_tokens=12) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
            if event.type in ("response.completed", "response.incomplete"):
                final = event.response
    if final is None:
        return fail(f"no final response event: {kinds}")
    if kinds[0] != "response.created" or kinds[-1] not in ("response.completed", "response.incomplete"):
        return fail(f"stream events: {kinds}")
    if "".join(deltas) != final.output_text:
        return fail(f"deltas {''.join(deltas)!r} are not the final text {final.output_text!r}")
    print(f"streamed {len(deltas)} deltas, {final.usage.output_tokens} tokens: {final.output_text!r}")
    return 0


def check_parse(client: openai.OpenAI, model: str) -> int:
    parsed = client.responses.parse(model=model, input="Name a city and its population.", text_format=City,
                                    max_output_tokens=64)
    city = parsed.output_parsed
    if not isinstance(city, City):
        return fail(f"parse: {parsed!r}")
    print(f"parsed: {city!r}")
    return 0


def check_tool_round_trip(client: openai.OpenAI, model: str) -> int:
    asked = client.responses.create(model=model, input="What is the weather in Paris?", tools=[WEATHER],
                                    tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=64)
    calls = [item for item in asked.output if item.type == "function_call"]
    if len(calls) != 1 or calls[0].name != "get_weather":
        return fail(f"forced call: {asked!r}")
    arguments = json.loads(calls[0].arguments)
    print(f"tool call: get_weather({json.dumps(arguments)})")
    answered = client.responses.create(
        model=model, previous_response_id=asked.id, tools=[WEATHER], max_output_tokens=16,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 21 C"}])
    if answered.previous_response_id != asked.id or answered.usage.input_tokens <= asked.usage.input_tokens:
        return fail(f"round trip: {answered!r}")
    print(f"round trip: {answered.usage.input_tokens} prompt tokens "
          f"({answered.usage.input_tokens_details.cached_tokens} cached): {answered.output_text!r}")
    kept = client.responses.retrieve(answered.id)
    if kept.id != answered.id or kept.output_text != answered.output_text:
        return fail(f"retrieve: {kept!r}")
    items = list(client.responses.input_items.list(answered.id, order="asc"))
    if [item.type for item in items][-2:] != ["function_call", "function_call_output"]:
        return fail(f"input items: {items!r}")
    print(f"input items: {', '.join(item.type for item in items)}")
    deleted = client.responses.delete(answered.id)
    try:
        client.responses.retrieve(answered.id)
        return fail("a deleted response was still there")
    except openai.NotFoundError:
        pass
    print(f"retrieved and deleted: {answered.id} ({deleted})")
    return 0


def check_refusals(client: openai.OpenAI, model: str) -> int:
    try:
        client.responses.create(model=model, input="x", previous_response_id="resp_gone")
        return fail("an unknown previous_response_id was accepted")
    except openai.NotFoundError as e:
        if e.body.get("code") != "previous_response_not_found":
            return fail(f"unknown previous response: {e.body}")
    try:
        client.responses.create(model=model, input="x", reasoning={"effort": "high"})
        return fail("reasoning was accepted")
    except openai.BadRequestError as e:
        if e.body.get("param") != "reasoning":
            return fail(f"reasoning refused without naming it: {e.body}")
    print("refused by name: previous_response_id (404), reasoning (400)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key", default="none")
    args = parser.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0)
    model = client.models.list().data[0].id
    for check in (check_response, check_stream, check_parse, check_tool_round_trip, check_refusals):
        if check(client, model):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
