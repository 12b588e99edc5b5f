#!/usr/bin/env python3
"""Render the chat-template cases of tests/fixtures/chat/cases.json with Hugging Face transformers.

For every case it writes ``tests/fixtures/chat/<name>.txt``: exactly what
``tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=..., **kwargs)``
returns, no newline added. ``core/src/tokenize/chat_tests.rs`` renders the same cases with minijinja
and compares byte for byte.

Inputs are the real tokenizer folders that ``.ci/run`` fetches (``$TOKENROUTER_ASSETS``, default
``.cache/assets``): ``qwen3/`` (its template is in tokenizer_config.json) and ``llama3/`` (the
Llama-3.2-Instruct template as ``chat_template.jinja``; the tokenizer_config.json that ships with the
tokenizer has none). A case's ``now_unix`` pins ``strftime_now`` by patching the clock transformers
reads, so the Llama date line is reproducible.

Usage (no torch needed)::

    python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install transformers jinja2
    /tmp/tokvenv/bin/python scripts/make_chat_fixtures.py
"""

import datetime as real_datetime
import json
import os
import pathlib
import sys

import jinja2
import transformers
from transformers import AutoTokenizer
from transformers.utils import chat_template_utils

REPO = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "chat"
ASSETS = pathlib.Path(os.environ.get("TOKENROUTER_ASSETS", REPO / ".cache" / "assets"))


class FixedClock(real_datetime.datetime):
    """datetime whose now() is the case's instant, in UTC like the Rust side."""

    fixed = None

    @classmethod
    def now(cls, tz=None):
        return real_datetime.datetime.fromtimestamp(cls.fixed, real_datetime.timezone.utc).replace(tzinfo=None)


def render(tokenizer, case):
    if "now_unix" in case:
        FixedClock.fixed = case["now_unix"]
        chat_template_utils.datetime = FixedClock
    else:
        chat_template_utils.datetime = real_datetime.datetime
    return tokenizer.apply_chat_template(
        case["messages"],
        tokenize=False,
        add_generation_prompt=case["add_generation_prompt"],
        tools=case.get("tools"),
        **case.get("kwargs", {}),
    )


def main():
    cases = json.loads((FIXTURES / "cases.json").read_text())["cases"]
    tokenizers = {}
    for case in cases:
        model = case["model"]
        if model not in tokenizers:
            folder = ASSETS / model
            if not (folder / "tokenizer.json").is_file():
                sys.exit(f"missing {folder}/tokenizer.json: run .ci/run first")
            tokenizers[model] = AutoTokenizer.from_pretrained(str(folder))
        text = render(tokenizers[model], case)
        (FIXTURES / f"{case['name']}.txt").write_bytes(text.encode("utf-8"))
        print(f"{case['name']}: {len(text)} chars")
    print(f"transformers {transformers.__version__}, jinja2 {jinja2.__version__}")


if __name__ == "__main__":
    main()
