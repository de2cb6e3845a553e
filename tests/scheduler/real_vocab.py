"""Real tokenizers from llama.cpp's vocabulary files, for the tool-call tests.

llama-cpp-python's sdist (PyPI) vendors llama.cpp's tokenizer test files:
`models/ggml-vocab-<name>.gguf`, each a real model's vocabulary (ids, merges,
token types) with `.inp`/`.out` beside it: texts and the ids the model's own
tokenizer gives them (llama.cpp's reference). This script downloads the sdist
once (its sha256 checked against the index), keeps those files for the
families below, and writes each as a Hugging Face `tokenizer.json` (the same
ids, merges and special tokens) that vLLM serves like any other. The tests
check the conversion against the `.out` ids before using it.

    python -m tests.scheduler.real_vocab    # idempotent; prints the folder

Files land in <cache>/real-vocab (cache: $CONTINUUM_REAL_VOCAB_CACHE, else
~/.cache/vllm-continuum/real-vocab), shared by every clone. The `.gguf` files
are read with the `gguf` reader vendored in the same sdist (gguf-py), so
nothing new is installed.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

from tests.conformance.fetch import cache_base, download, sdist_link

PROJECT, VERSION = "llama-cpp-python", "0.3.36"
STAMP = ".sha256"

# A family's vocabulary file: how llama.cpp reads it (the pre-tokenizer's
# split, from its src/llama-vocab.cpp) and what HF's tokenizer does the same.
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
VOCABS = {
    "gemma-4": {"kind": "spm-bpe"},  # Gemma 4: <|tool_call>call:NAME{...}<tool_call|>
    "llama-bpe": {"kind": "byte-level", "split": _LLAMA3_SPLIT},  # Llama 3 (8B)
    "qwen2": {"kind": "byte-level", "split": _QWEN2_SPLIT},  # Qwen2: no tool-call token
}
CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types that are added tokens


def cache_dir() -> Path:
    if env := os.environ.get("CONTINUUM_REAL_VOCAB_CACHE"):
        return Path(env)
    return cache_base() / "real-vocab"


def _field(reader, key):
    field = reader.fields.get(key)
    if field is None:
        return None
    values = [field.parts[i] for i in field.data]
    if field.types and field.types[0].name == "ARRAY":
        kind = field.types[-1].name
    else:
        kind = field.types[0].name
    if kind == "STRING":
        return [bytes(v).decode("utf-8") for v in values]
    return [v.tolist()[0] for v in values]


def tokenizer_spec(gguf_path: Path, kind: str, split: str | None = None) -> dict:
    """The gguf vocabulary as an HF `tokenizer.json` (as a dict)."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type")
    merges = _field(reader, "tokenizer.ggml.merges")
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True}
             for i, (t, kind_) in enumerate(zip(tokens, types)) if kind_ in (CONTROL, USER_DEFINED)]
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
             "ignore_merges": False, "vocab": {t: i for i, t in enumerate(tokens)},
             "merges": [m.split(" ", 1) for m in merges]}
    if kind == "byte-level":
        model["ignore_merges"] = True
        return {"version": "1.0", "added_tokens": added, "normalizer": None,
                "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                    {"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated",
                     "invert": False},
                    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                     "use_regex": False}]},
                "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": True,
                                                    "trim_offsets": True, "use_regex": True},
                "model": model}
    # SentencePiece-style BPE (Gemma 4): spaces are `▁`, unknown bytes `<0xNN>`;
    # llama.cpp splits only at newline runs.
    model.update(byte_fallback=True, unk_token="<unk>")
    return {"version": "1.0", "added_tokens": added,
            "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
            "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "[^\\n]+|\\n+"},
                              "behavior": "Isolated", "invert": False},
            "post_processor": None,
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"}]},
            "model": model}


def _extract(archive: Path, names: list[str], into: Path) -> None:
    prefix = f"{PROJECT.replace('-', '_')}-{VERSION}/vendor/llama.cpp/"
    with tarfile.open(archive) as tar:
        members = []
        for member in tar.getmembers():
            rel = member.name.removeprefix(prefix)
            if member.isfile() and rel != member.name and (
                    rel in names or rel.startswith("gguf-py/gguf/")):
                member.name = rel
                members.append(member)
        tar.extractall(into, members=members, filter="data")


def fetch() -> Path:
    """<cache>/real-vocab/<name>/tokenizer.json (+ the `.inp`/`.out` reference) per VOCABS."""
    target = cache_dir()
    if (target / STAMP).is_file():
        return target
    url, sha = sdist_link(VERSION, PROJECT)
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"[real-vocab] fetching {url.rsplit('/', 1)[-1]} (llama.cpp's vocabulary files only are kept)",
          file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        archive = download(url, sha, Path(tmp) / "sdist.tar.gz")
        src, tree = Path(tmp) / "src", Path(tmp) / "tree"
        files = [f"models/ggml-vocab-{n}.gguf{ext}" for n in VOCABS for ext in ("", ".inp", ".out")]
        _extract(archive, files, src)
        sys.path.insert(0, str(src / "gguf-py"))
        try:
            for name, how in VOCABS.items():
                out = tree / name
                out.mkdir(parents=True)
                spec = tokenizer_spec(src / f"models/ggml-vocab-{name}.gguf", **how)
                (out / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))
                for ext in ("inp", "out"):
                    shutil.copy(src / f"models/ggml-vocab-{name}.gguf.{ext}", out / f"reference.{ext}")
        finally:
            sys.path.remove(str(src / "gguf-py"))
            for module in [m for m in sys.modules if m == "gguf" or m.startswith("gguf.")]:
                del sys.modules[module]
        (tree / STAMP).write_text(f"{sha}  {url}\n")
        shutil.rmtree(target, ignore_errors=True)
        tree.rename(target)
    return target


if __name__ == "__main__":
    print(fetch())
