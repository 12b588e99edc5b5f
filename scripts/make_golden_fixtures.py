#!/usr/bin/env python3
"""Generate golden test fixtures for tokenrouter's Rust model runtime.

What it makes
-------------
Under ``tests/fixtures/golden/<name>/`` (name = qwen3, llama, qwen2) it writes:

* a Hugging Face model folder (``config.json``, ``generation_config.json``,
  safetensors weights) saved with ``save_pretrained(..., safe_serialization=True)``
  from a tiny, randomly initialised (seeded) model:

  - ``qwen3``: Qwen3ForCausalLM, float32, explicit ``head_dim`` 32 != hidden/heads,
    q_norm/k_norm, tied embeddings, rope_theta 1e6.
  - ``llama``: LlamaForCausalLM, **bfloat16** weights, untied lm_head,
    llama3 rope scaling (original_max_position_embeddings 64 < 512 so the
    scaling really changes the frequencies).
  - ``qwen2``: Qwen2ForCausalLM, float32, q/k/v bias, tied embeddings,
    **sharded** into several safetensors files plus
    ``model.safetensors.index.json``.

* ``golden.json`` with the expected logits, computed with eager attention in
  float32 under ``torch.no_grad()``:

  - ``sequences``: 3 cases, each ``{"input_ids": [...], "logits": [[vocab]...]}``
    with the logits of every position.
  - ``incremental``: for the first case, the last-position logits of each step of
    a KV-cached decode (prefill of ``prefill_len`` tokens, then one token at a
    time with ``past_key_values``); ``step_logits[i]`` belongs to position
    ``prefill_len - 1 + i`` (step 0 is the prefill's last position).
  - ``dtype`` (stored weight dtype), ``tolerance``, ``max_abs_logit``,
    ``logit_std`` and the versions used.

For the bfloat16 model the expected logits come from exactly the stored
bf16-rounded weights, upcast to float32 and run in float32.

Floats are written at full float32 precision: each value is the shortest
decimal string that round-trips to the same float32 (parse it as f32 to get the
exact value back).

HF's default init (std 0.02) gives tiny logits that make comparisons weak, so
the weights are re-initialised: linear/embedding weights ~ N(0, 0.15^2), norm
weights 1 + 0.1*randn, biases 0.1*randn; the logit std lands around 1-3.

After saving, each folder is reloaded with ``AutoModelForCausalLM.from_pretrained``
in float32 and the logits are re-checked against ``golden.json``.

How to run
----------
Needs Python 3 with torch, transformers and safetensors from PyPI (the default
torch wheel is fine, it runs on CPU; no GPU needed, ~5 s)::

    pip install torch "transformers>=4.56,<5" safetensors
    python3 scripts/make_golden_fixtures.py            # writes tests/fixtures/golden
    python3 scripts/make_golden_fixtures.py --out DIR  # elsewhere

Why transformers 4.x: the weights and logits are bit-identical with 4.57 and
5.x, but 5.x writes config.json in a new spelling (``rope_parameters`` holding
rope_theta/rope_type/scaling, instead of top-level ``rope_theta`` +
``rope_scaling``). Published checkpoints use the 4.x spelling, 5.x still reads
it, and 4.x silently misreads the 5.x spelling (falls back to the default
rope_theta). The committed fixtures therefore use 4.x's spelling; running with
5.x works but prints a warning.

Output is deterministic for a given torch/transformers version.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

SEED = 1234
VOCAB = 512
# Lengths of the three test sequences. The first one is also used for the
# incremental (KV-cache) check, so it is the one with a useful number of steps.
SEQ_LENS = (19, 7, 33)
PREFILL_LEN = 4
TOLERANCE = 1e-4

WEIGHT_STD = 0.15
NORM_STD = 0.1
BIAS_STD = 0.1

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    hidden_act="silu",
)


def model_specs():
    """(name, config, stored dtype, save_pretrained kwargs) per fixture."""
    return [
        (
            "qwen3",
            Qwen3Config(
                **COMMON,
                head_dim=32,
                tie_word_embeddings=True,
                rope_theta=1_000_000.0,
            ),
            torch.float32,
            {},
        ),
        (
            "llama",
            LlamaConfig(
                **COMMON,
                tie_word_embeddings=False,
                rope_theta=500_000.0,
                rope_scaling={
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                },
            ),
            torch.bfloat16,
            {},
        ),
        (
            "qwen2",
            Qwen2Config(
                **COMMON,
                tie_word_embeddings=True,
                rope_theta=1_000_000.0,
            ),
            torch.float32,
            {"max_shard_size": "100KB"},
        ),
    ]


def reinit_(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Re-initialise all parameters so the logits are O(1) instead of O(0.01)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + NORM_STD * noise)
            elif name.endswith(".bias"):
                p.copy_(BIAS_STD * noise)
            elif name.endswith(".weight"):
                p.copy_(WEIGHT_STD * noise)
            else:
                raise ValueError(f"unexpected parameter {name}")


def f32_list(t: torch.Tensor):
    """Nested lists of Python floats, each exactly a float32 value, written with
    the shortest decimal string that round-trips to that float32."""
    a = t.detach().to(torch.float32).cpu().numpy()

    def conv(x):
        if x.ndim == 0:
            return float(repr(np.float32(x)).removeprefix("np.float32(").removesuffix(")"))
        return [conv(y) for y in x]

    return conv(a)


@torch.no_grad()
def full_logits(model, ids: list[int]) -> torch.Tensor:
    out = model(input_ids=torch.tensor([ids]), use_cache=False)
    return out.logits[0].to(torch.float32)


@torch.no_grad()
def incremental_logits(model, ids: list[int], prefill_len: int) -> torch.Tensor:
    out = model(input_ids=torch.tensor([ids[:prefill_len]]), use_cache=True)
    steps = [out.logits[0, -1]]
    past = out.past_key_values
    for tok in ids[prefill_len:]:
        out = model(input_ids=torch.tensor([[tok]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
        steps.append(out.logits[0, -1])
    return torch.stack(steps).to(torch.float32)


def make_fixture(name, config, dtype, save_kwargs, out_root: Path, seed: int) -> dict:
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    config.architectures = [
        {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[name]
    ]
    model = AutoModelForCausalLM.from_config(
        config, attn_implementation="eager", dtype=torch.float32
    )
    reinit_(model, gen)
    model.eval()

    # Round the weights to the stored dtype (a no-op for float32) while keeping
    # everything else (e.g. the rope inv_freq buffer) in float32, so the golden
    # logits come from exactly the weights that are stored.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(dtype).to(torch.float32))

    input_ids = [
        torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in SEQ_LENS
    ]
    logits = [full_logits(model, ids) for ids in input_ids]
    steps = incremental_logits(model, input_ids[0], PREFILL_LEN)

    # The KV path must agree with the full forward pass.
    kv_diff = (steps - logits[0][PREFILL_LEN - 1 :]).abs().max().item()
    assert kv_diff < TOLERANCE, f"{name}: KV-cache logits differ by {kv_diff}"

    all_logits = torch.cat(logits)
    logit_std = all_logits.std().item()
    max_abs = all_logits.abs().max().item()

    folder = out_root / name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    model.to(dtype).save_pretrained(folder, safe_serialization=True, **save_kwargs)

    golden = {
        "model": name,
        "architecture": config.architectures[0],
        "dtype": str(dtype).removeprefix("torch."),
        "tolerance": TOLERANCE,
        "max_abs_logit": max_abs,
        "logit_std": logit_std,
        "generated_by": "scripts/make_golden_fixtures.py",
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "sequences": [
            {"input_ids": ids, "logits": f32_list(lg)}
            for ids, lg in zip(input_ids, logits)
        ],
        "incremental": {
            "prefill_len": PREFILL_LEN,
            "step_logits": f32_list(steps),
        },
    }
    (folder / "golden.json").write_text(json.dumps(golden, separators=(",", ":")) + "\n")
    print(
        f"{name}: dtype={golden['dtype']} logit_std={logit_std:.4f} "
        f"max_abs_logit={max_abs:.4f} kv_vs_full_max_diff={kv_diff:.3g}"
    )
    return golden


def verify(folder: Path) -> float:
    """Reload the saved folder in float32 and compare against golden.json."""
    golden = json.loads((folder / "golden.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    worst = 0.0
    for case in golden["sequences"]:
        got = full_logits(model, case["input_ids"])
        want = torch.tensor(case["logits"], dtype=torch.float32)
        worst = max(worst, (got - want).abs().max().item())
    inc = golden["incremental"]
    got = incremental_logits(model, golden["sequences"][0]["input_ids"], inc["prefill_len"])
    want = torch.tensor(inc["step_logits"], dtype=torch.float32)
    worst = max(worst, (got - want).abs().max().item())

    cfg = json.loads((folder / "config.json").read_text())
    print(
        f"{folder.name}: reload max abs diff = {worst:.3g}; "
        f"config architectures={cfg.get('architectures')} "
        f"dtype={cfg.get('dtype', cfg.get('torch_dtype'))}; "
        f"files: {sorted(p.name for p in folder.iterdir())}"
    )
    return worst


def main() -> int:
    repo_root = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=repo_root / "tests" / "fixtures" / "golden")
    args = ap.parse_args()

    torch.set_num_threads(1)  # keep CPU reductions deterministic
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    if int(transformers.__version__.split(".")[0]) >= 5:
        print(
            "WARNING: transformers >= 5 writes config.json with `rope_parameters` "
            "instead of `rope_theta`/`rope_scaling`; the committed fixtures use "
            'transformers>=4.56,<5 (see the top of this script).',
            file=sys.stderr,
        )
    for i, (name, config, dtype, save_kwargs) in enumerate(model_specs()):
        make_fixture(name, config, dtype, save_kwargs, args.out, SEED + i)

    ok = True
    for name, *_ in model_specs():
        diff = verify(args.out / name)
        if not diff <= TOLERANCE:
            print(f"{name}: FAILED, reload diff {diff} > {TOLERANCE}", file=sys.stderr)
            ok = False
        if name == "qwen2":
            shards = sorted((args.out / name).glob("model-*.safetensors"))
            if len(shards) < 2 or not (args.out / name / "model.safetensors.index.json").exists():
                print(f"{name}: FAILED, expected >= 2 shards plus index", file=sys.stderr)
                ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
