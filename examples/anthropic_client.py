"""The official `anthropic` Python client against a tokenrouter server (the Messages API):
a message, a streamed message, a forced tool call sent back with its result, the same
call streamed, token counting, and a refusal by name.

    pip install anthropic
    python3 examples/anthropic_client.py --base-url http://127.0.0.1:8000

Works on the random-weight demo: a named tool_choice makes the grammar, not the model,
write the call. Exits non-zero if anything looks wrong, so tests can run it.
"""
import argparse
import json
import sys
import urllib.request

import anthropic

WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 10}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
FORCED = {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}


def fail(message: str) -> int:
    print(message, file=sys.stderr)
    return 1


def first_model(base_url: str, api_key: str) -> str:
    request = urllib.request.Request(f"{base_url}/v1/models", headers={"Authorization": f"Bearer {api_key}"})
    with urllib.request.urlopen(request) as response:
        return json.load(response)["data"][0]["id"]


def check_message(client: anthropic.Anthropic, model: str) -> int:
    message = client.messages.create(model=model, max_tokens=16, system="Be brief.",
                                     messages=[{"role": "user", "content": "Say hello."}])
    if message.type != "message" or message.content[0].type != "text" or message.usage.output_tokens <= 0:
        return fail(f"message: {message!r}")
    if message.stop_reason not in ("end_turn", "max_tokens"):
        return fail(f"stop_reason {message.stop_reason}")
    print(f"message: {message.usage.output_tokens} tokens, stop {message.stop_reason}: {message.content[0].text!r}")
    counted = client.messages.count_tokens(model=model, system="Be brief.",
                                           messages=[{"role": "user", "content": "Say hello."}])
    prompt = message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)
    if counted.input_tokens != prompt:
        return fail(f"count_tokens says {counted.input_tokens}, the message's prompt was {prompt}")
    print(f"count_tokens: {counted.input_tokens}, as the message's prompt")
    return 0


def check_stream(client: anthropic.Anthropic, model: str) -> int:
    text = ""
    with client.messages.stream(model=model, max_tokens=16, messages=QUESTION) as stream:
        for piece in stream.text_stream:
            text += piece
        final = stream.get_final_message()
    if final.usage.output_tokens <= 0 or final.content[0].text != text:
        return fail(f"streamed {text!r}, final {final!r}")
    print(f"streamed {final.usage.output_tokens} tokens: {text!r}")
    return 0


def check_tool_round_trip(client: anthropic.Anthropic, model: str) -> int:
    message = client.messages.create(model=model, max_tokens=200, messages=QUESTION, tools=[WEATHER],
                                     tool_choice=FORCED)
    calls = [block for block in message.content if block.type == "tool_use"]
    if message.stop_reason != "tool_use" or len(calls) != 1 or calls[0].name != "get_weather":
        return fail(f"forced call: {message!r}")
    if not isinstance(calls[0].input, dict) or not isinstance(calls[0].input.get("city"), str):
        return fail(f"the call's input is {calls[0].input!r}")
    print(f"tool call: get_weather({json.dumps(calls[0].input)}), id {calls[0].id}")
    history = QUESTION + [
        {"role": "assistant", "content": message.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0].id, "content": "Sunny, 21 C"}]},
    ]
    answer = client.messages.create(model=model, max_tokens=8, messages=history, tools=[WEATHER],
                                    tool_choice={"type": "none"})
    if any(block.type == "tool_use" for block in answer.content):
        return fail(f"tool_choice none after a round trip: {answer!r}")
    print(f"round trip: {answer.usage.input_tokens + (answer.usage.cache_read_input_tokens or 0)} prompt tokens"
          " with the call and its result")
    return 0


def check_streamed_tool(client: anthropic.Anthropic, model: str) -> int:
    with client.messages.stream(model=model, max_tokens=200, messages=QUESTION, tools=[WEATHER],
                                tool_choice=FORCED) as stream:
        final = stream.get_final_message()
    calls = [block for block in final.content if block.type == "tool_use"]
    if final.stop_reason != "tool_use" or len(calls) != 1 or not isinstance(calls[0].input.get("city"), str):
        return fail(f"streamed call: {final!r}")
    print(f"streamed tool call: get_weather({json.dumps(calls[0].input)})")
    return 0


def check_refusal(client: anthropic.Anthropic, model: str) -> int:
    try:
        client.messages.create(model=model, max_tokens=8, messages=QUESTION,
                               extra_body={"thinking": {"type": "enabled", "budget_tokens": 1024}})
    except anthropic.BadRequestError as e:
        if "thinking" not in str(e):
            return fail(f"the refusal does not name the field: {e}")
        print(f"refused by name: {e.body['error']['message']}")
        return 0
    return fail("`thinking` was accepted")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--api-key", default="none")
    parser.add_argument("--model", default=None, help="model id; the first listed when omitted")
    args = parser.parse_args()
    # The SDK adds /v1/messages itself.
    base_url = args.base_url.rstrip("/").removesuffix("/v1")
    client = anthropic.Anthropic(base_url=base_url, api_key=args.api_key)
    model = args.model or first_model(base_url, args.api_key)
    for check in (check_message, check_stream, check_tool_round_trip, check_streamed_tool, check_refusal):
        if check(client, model):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
