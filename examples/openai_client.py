"""The official `openai` Python client against a tokenrouter server: one streamed
chat completion (with usage) and one plain completion.

    pip install openai
    python3 examples/openai_client.py --base-url http://127.0.0.1:8000/v1

Exits non-zero if anything looks wrong, so tests can run it.
"""
import argparse
import sys

from openai import OpenAI


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key", default="none")
    parser.add_argument("--model", default=None, help="model id; the first listed when omitted")
    args = parser.parse_args()

    client = OpenAI(base_url=args.base_url, api_key=args.api_key)
    model = args.model or client.models.list().data[0].id

    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=16,
        temperature=0.7,
        seed=1,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage = "", None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
        if chunk.usage is not None:
            usage = chunk.usage
    if usage is None or usage.completion_tokens <= 0:
        print(f"no usage in the stream: {usage!r}", file=sys.stderr)
        return 1
    print(f"streamed {usage.completion_tokens} tokens: {text!r}")

    completion = client.completions.create(model=model, prompt="Once upon a time", max_tokens=8, temperature=0)
    if not completion.choices or completion.usage.completion_tokens <= 0:
        print(f"bad completion: {completion!r}", file=sys.stderr)
        return 1
    print(f"completion: {completion.choices[0].text!r} ({completion.usage.completion_tokens} tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
