#!/usr/bin/env python3
"""Writes a Hugging Face Qwen3 / Qwen2 / Llama folder as a GGUF file (f32 or f16)
for llama.cpp, without torch: numpy reads the safetensors, the `gguf` package
(PyPI) writes the file. The same tensors and metadata as llama.cpp's own
convert_hf_to_gguf.py for these architectures, whose vocabulary step needs
transformers (and so torch).

    hf_to_gguf.py /tmp/m/medium --out medium-f16.gguf --dtype f16
"""

import argparse
import json
import pathlib
import struct
import sys

import numpy as np
import gguf

ARCHES = {"qwen3": gguf.MODEL_ARCH.QWEN3, "qwen2": gguf.MODEL_ARCH.QWEN2, "llama": gguf.MODEL_ARCH.LLAMA}
# The pre-tokenizer names llama.cpp gives these families' regexes.
PRE_TOKENIZERS = {"qwen3": "qwen2", "qwen2": "qwen2", "llama": "llama-bpe"}
NUMPY_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


def read_safetensors(path):
    """Yields (name, float32 array) from one .safetensors file, bf16 included
    (numpy has no bf16: its bits are the top half of an f32's)."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in NUMPY_DTYPES:
            sys.exit(f"{path}: {name}: dtype {info['dtype']} is not supported")
        start, end = info["data_offsets"]
        raw = data[start:end].view(NUMPY_DTYPES[info["dtype"]]).reshape(info["shape"])
        if info["dtype"] == "BF16":
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        yield name, raw.astype(np.float32)


def checkpoint_files(folder):
    index = folder / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / s for s in shards]
    return [folder / "model.safetensors"]


def permute_for_rope(w, n_head):
    """HF Llama stores q/k rows in rotate-half order; llama.cpp wants interleaved."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_params(writer, cfg, dtype):
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(cfg.get("num_key_value_heads", cfg["num_attention_heads"]))
    writer.add_rope_freq_base(cfg.get("rope_theta", 10000.0))
    writer.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if dtype == "f16" else gguf.LlamaFileType.ALL_F32)


def write_vocab(writer, folder, cfg):
    """Token list and types from tokenizer.json, padded to the model's vocabulary;
    merges and special ids through gguf's SpecialVocab (it reads the files itself)."""
    tok = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    by_id = {i: t for t, i in tok["model"]["vocab"].items()}
    added = {t["id"]: t for t in tok.get("added_tokens", [])}
    tokens, types = [], []
    for i in range(cfg["vocab_size"]):
        if i in added:
            tokens.append(added[i]["content"])
            types.append(gguf.TokenType.CONTROL if added[i].get("special") else gguf.TokenType.USER_DEFINED)
        elif i in by_id:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(PRE_TOKENIZERS[cfg["model_type"]])
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    gguf.SpecialVocab(folder, load_merges=True, n_vocab=len(tokens)).add_to_gguf(writer)


def write_tensors(writer, folder, cfg, arch, dtype):
    n_layers = cfg["num_hidden_layers"]
    names = gguf.get_tensor_name_map(arch, n_layers)
    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_head)
    for path in checkpoint_files(folder):
        for name, w in read_safetensors(path):
            if cfg["model_type"] == "llama" and name.endswith("q_proj.weight"):
                w = permute_for_rope(w, n_head)
            elif cfg["model_type"] == "llama" and name.endswith("k_proj.weight"):
                w = permute_for_rope(w, n_kv)
            gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
            if gguf_name is None:
                sys.exit(f"{path}: no GGUF name for tensor {name}")
            # Norms and other vectors stay f32, as llama.cpp's converter keeps them.
            if dtype == "f16" and w.ndim >= 2:
                w = w.astype(np.float16)
            writer.add_tensor(gguf_name, np.ascontiguousarray(w))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=pathlib.Path, help="Hugging Face model folder")
    ap.add_argument("--out", type=pathlib.Path, required=True)
    ap.add_argument("--dtype", choices=["f32", "f16"], default="f32")
    args = ap.parse_args()
    cfg = json.loads((args.model / "config.json").read_text())
    if cfg.get("model_type") not in ARCHES:
        sys.exit(f"{args.model}: model_type {cfg.get('model_type')!r} is not one of {sorted(ARCHES)}")
    arch = ARCHES[cfg["model_type"]]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    part = args.out.with_suffix(".gguf.part")
    writer = gguf.GGUFWriter(part, gguf.MODEL_ARCH_NAMES[arch])
    write_params(writer, cfg, args.dtype)
    write_vocab(writer, args.model, cfg)
    write_tensors(writer, args.model, cfg, arch, args.dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    part.rename(args.out)
    print(args.out)


if __name__ == "__main__":
    main()
