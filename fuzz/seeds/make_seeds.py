#!/usr/bin/env python3
"""Writes the fuzz seed corpora: small valid GGUF files (gguf-py's writer).

seeds/gguf_reader/: varied metadata (every value type, nested arrays) and tensors of
several ggml types; an empty file; a version-2 file with a 64-byte alignment.
seeds/tokenizer_loader/: vocabulary-only files the model loader's tokenizer path
accepts: byte-level BPE (gpt-2, llama-bpe, qwen2 pre-tokenizers), SentencePiece
(`llama`, with byte tokens, scores and types) and `gemma4`.

Deterministic; run from anywhere: python3 fuzz/seeds/make_seeds.py
"""
import os
import tempfile

import numpy as np
import gguf

HERE = os.path.dirname(os.path.abspath(__file__))


def write(path, fill, version=None):
    with tempfile.TemporaryDirectory() as d:
        tmp = os.path.join(d, "x.gguf")
        w = gguf.GGUFWriter(tmp, arch="llama")
        fill(w)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        data = bytearray(open(tmp, "rb").read())
    if version is not None:
        data[4:8] = version.to_bytes(4, "little")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "wb").write(bytes(data))
    print(f"{path}: {len(data)} bytes")


def varied(w):
    w.add_uint8("u8", 7)
    w.add_int8("i8", -7)
    w.add_uint16("u16", 65535)
    w.add_int16("i16", -300)
    w.add_uint32("u32", 4_000_000_000)
    w.add_int32("i32", -2_000_000_000)
    w.add_uint64("u64", 2**64 - 1)
    w.add_int64("i64", -(2**63))
    w.add_float32("f32", 1.5)
    w.add_float64("f64", -2.25)
    w.add_bool("bool", True)
    w.add_string("unicode", "héllo ✓")
    w.add_array("tokens", ["a", "bc", ""])
    w.add_array("scores", [0.5, -1.0])
    w.add_array("nested", [[1, 2], [3]])
    w.add_tensor("f32", np.arange(6, dtype=np.float32).reshape(2, 3))
    w.add_tensor("f16", np.ones(5, dtype=np.float16))
    w.add_tensor("q8", np.full((2, 68), 0x11, dtype=np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("q4k", np.full((1, 144), 0x22, dtype=np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    w.add_tensor("i32", np.array([1, -2, 3], dtype=np.int32))


def empty(w):
    pass


def aligned(w):
    w.add_uint32("general.alignment", 64)
    w.add_string("general.name", "v2")
    w.add_tensor("a", np.zeros(3, dtype=np.float32))
    w.add_tensor("b", np.zeros((2, 2), dtype=np.float16))


# GPT-2's byte-to-unicode map for the bytes used here: space -> 'Ġ', newline -> 'Ċ'.
BYTE_LEVEL = {" ": "Ġ", "\n": "Ċ"}


def bpe(pre, model="gpt2", template=True, add_bos=None):
    def fill(w):
        chars = [BYTE_LEVEL.get(chr(c), chr(c)) for c in [10] + list(range(32, 127))]
        merges = ["Ġ t", "h e", "Ġt he", "l l", "e ll", "h ell", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor ld", "1 2", "12 3"]
        tokens = list(chars)
        for m in merges:
            a, b = m.split(" ")
            for t in (a, b, a + b):
                if t not in tokens:
                    tokens.append(t)
        types = [1] * len(tokens)
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        tokens += specials + ["<tag>"]
        types += [3, 3, 3, 4]
        w.add_string("tokenizer.ggml.model", model)
        if pre is not None:
            w.add_string("tokenizer.ggml.pre", pre)
        w.add_array("tokenizer.ggml.tokens", tokens)
        w.add_array("tokenizer.ggml.token_type", types)
        w.add_array("tokenizer.ggml.merges", merges)
        eot = tokens.index("<|endoftext|>")
        w.add_uint32("tokenizer.ggml.bos_token_id", eot)
        w.add_uint32("tokenizer.ggml.eos_token_id", tokens.index("<|im_end|>"))
        w.add_uint32("tokenizer.ggml.padding_token_id", eot)
        if add_bos is not None:
            w.add_bool("tokenizer.ggml.add_bos_token", add_bos)
        if template:
            w.add_string(
                "tokenizer.chat_template",
                "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
            )

    return fill


def spm(add_space_prefix=None):
    def fill(w):
        tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
        types = [2, 3, 3] + [6] * 256
        scores = [0.0] * len(tokens)
        for p in ["▁", "h", "e", "l", "o", "w", "r", "d", ",", "é"]:
            tokens.append(p)
            types.append(1)
            scores.append(-100.0)
        for i, p in enumerate(["▁h", "he", "ll", "lo", "▁he", "llo", "▁hello", "▁w", "or", "▁wor", "ld", "▁world"]):
            tokens.append(p)
            types.append(1)
            scores.append(-1.0 - i)
        tokens += ["<tag>", "[UNUSED0]"]
        types += [4, 5]
        scores += [0.0, 0.0]
        w.add_string("tokenizer.ggml.model", "llama")
        w.add_array("tokenizer.ggml.tokens", tokens)
        w.add_array("tokenizer.ggml.scores", scores)
        w.add_array("tokenizer.ggml.token_type", types)
        w.add_uint32("tokenizer.ggml.bos_token_id", 1)
        w.add_uint32("tokenizer.ggml.eos_token_id", 2)
        w.add_uint32("tokenizer.ggml.unknown_token_id", 0)
        w.add_bool("tokenizer.ggml.add_eos_token", True)
        if add_space_prefix is not None:
            w.add_bool("tokenizer.ggml.add_space_prefix", add_space_prefix)

    return fill


def main():
    r = os.path.join(HERE, "gguf_reader")
    write(os.path.join(r, "varied.gguf"), varied)
    write(os.path.join(r, "empty.gguf"), empty)
    write(os.path.join(r, "v2_align64.gguf"), aligned, version=2)
    t = os.path.join(HERE, "tokenizer_loader")
    write(os.path.join(t, "bpe_gpt2.gguf"), bpe("gpt-2"))
    write(os.path.join(t, "bpe_llama3.gguf"), bpe("llama-bpe", add_bos=True, template=False))
    write(os.path.join(t, "bpe_qwen2.gguf"), bpe("qwen2", template=False))
    write(os.path.join(t, "bpe_gemma4.gguf"), bpe(None, model="gemma4", template=False))
    write(os.path.join(t, "spm_llama.gguf"), spm())
    write(os.path.join(t, "spm_no_space_prefix.gguf"), spm(add_space_prefix=False))


if __name__ == "__main__":
    main()
