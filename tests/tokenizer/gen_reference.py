#!/usr/bin/env python3
"""Reference token ids for tests/tokenizer (golden/*.txt).

Run with the scratch reference environment (never part of the build):

    .venv-ref/bin/python tests/tokenizer/gen_reference.py [--data DIR] [--model GGUF]

References:
  smollm2*.txt   llama.cpp through llama-cpp-python (Llama(vocab_only=True).tokenize(text,
                 add_bos=False, special=...)) on SmolLM2-135M-Instruct.Q4_1.gguf, whose
                 tokenizer.ggml.pre is "smollm"; the _llama3 / _qwen2 variants are the same vocabulary
                 written to a metadata-only GGUF with tokenizer.ggml.pre = "llama-bpe" / "qwen2", so
                 that llama.cpp applies those splitting rules. HF `tokenizers` built from the same
                 vocab/merges with the matching pre-tokenizer is run as a cross-check (printed).
  stories260K.txt  sentencepiece with tok512.model (how llama2.c tokenized the model's training data).
  stories260K_llamacpp.txt  llama.cpp on the same vocabulary written as a metadata-only GGUF
                 (tokenizer.ggml.model = "llama", as Llama 2 GGUFs are): llama.cpp's SentencePiece path,
                 which keeps runs of spaces (no remove_extra_whitespaces).

Each case records the token count, the SHA-256 of the ids as little-endian int32 bytes, and the
ids (all of them for short strings, the first 64 for whole files). Short strings are stored as hex.
"""
import argparse
import datetime
import hashlib
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))

TRICKY = [
    "Hello world",
    "  leading and trailing spaces  ",
    "multiple   spaces\tand\ttabs\n\nnewlines\r\n crlf \n",
    "don't I'm they'll we've she'd it's DON'T I'M THEY'LL We'Re 'S 'vE",
    "digits 1 12 123 1234 12345 3.14159 1,000,000 2024-01-01 x2y3z 9999999999",
    "unicode: café naïve Zürich façade — “quotes” ‘single’ … ½ ² ³ ٣ ١٢ Ⅻ ⅷ 中文字符 日本語テキスト 한국어",
    "emoji 😀👍🏽 🇫🇷 ❤️ 👨‍👩‍👧 ok",
    "mixed\u00a0nbsp\u2009thin\u3000ideographic\u2028line sep\u0085nel",
    "code: for (int i = 0; i < n; ++i) { x[i] += y[i] * 2; } // comment\n\tif (a && b || !c) return -1;",
    "special tokens <|im_start|>user\nhi<|im_end|> <|endoftext|> <s> </s>",
    "  \n \n  ",
    "",
    "a",
    " = = Section = = \n \n The 1 @,@ 000 @-@ year @.@ old ( born 1990 ) . \n",
    "combining e\u0301 n\u0303 a\u0308\u0304 and ’s ’t’re",
    "a" * 300 + "b" * 300 + " " + "9" * 100 + " " + "-" * 50,
    "control \x01\x02\x1c\x1f\x7f chars\x0b\x0c",
    "x\r\ny \r\n\r\n z\n\n\n   \n\t\n",
    "?!.,;: ...!!! ??? ''' \"\"\" ``` ~~~ ### $$$ %%% ^^^",
    "Ünïcödé ÄÖÜ ß ẞ ǅ ﬁ Ω Å K ſ",
]
BLOCK = 8192
# cases also run with special tokens parsed (flags bit 2)
PARSE_SPECIAL = [9]


def sha_ids(ids):
    return hashlib.sha256(np.asarray(ids, dtype="<i4").tobytes()).hexdigest()


def write_golden(path, header, cases):
    with open(path, "w") as f:
        for line in header:
            f.write("# " + line + "\n")
        for c in cases:
            f.write("case %s\n" % c["name"])
            f.write("flags %d\n" % c["flags"])
            if "file" in c:
                f.write("file %s\n" % c["file"])
            else:
                f.write("text_hex %s\n" % c["text"].encode("utf-8").hex())
            f.write("count %d\n" % len(c["ids"]))
            f.write("sha256 %s\n" % sha_ids(c["ids"]))
            if "file" in c:
                # per-block hashes locate the first difference in a long file
                blk = [hashlib.sha256(np.asarray(c["ids"][i:i + BLOCK], dtype="<i4").tobytes()).hexdigest()[:16]
                       for i in range(0, len(c["ids"]), BLOCK)]
                f.write("blocks %d %s\n" % (BLOCK, " ".join(blk)))
            ids = c["ids"] if "file" not in c else c["ids"][:64]
            f.write("%s %s\n" % ("ids" if "file" not in c else "first", " ".join(str(i) for i in ids)))
    print("wrote", os.path.relpath(path, ROOT))


def file_cases(data, encode):
    out = []
    for rel in ("wikitext-2-raw/wiki.test.raw", "wikitext-2-raw/wiki.valid.raw"):
        text = open(os.path.join(data, rel), "rb").read()
        out.append({"name": os.path.basename(rel), "flags": 0, "file": rel, "ids": encode(text, False)})
    return out


def tricky_cases(encode, with_special):
    out = []
    for i, s in enumerate(TRICKY):
        out.append({"name": "tricky:%d" % i, "flags": 0, "text": s, "ids": encode(s.encode("utf-8"), False)})
        if with_special and i in PARSE_SPECIAL:
            out.append({"name": "tricky:%d:special" % i, "flags": 2, "text": s,
                        "ids": encode(s.encode("utf-8"), True)})
    return out


def gguf_variant(src, pre, dst):
    """A metadata-only copy of a GGUF with tokenizer.ggml.pre replaced."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter
    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = GGUFWriter(dst, arch=arch)
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        t = f.types[0]
        v = f.contents()
        if k == "tokenizer.ggml.pre":
            v = pre
        if t == GGUFValueType.ARRAY:
            w.add_key_value(k, v, t, sub_type=f.types[-1])
        else:
            w.add_key_value(k, v, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def spm_gguf(src, model, dst):
    """A metadata-only GGUF: src's architecture keys, the sentencepiece model as tokenizer.ggml.*."""
    import sentencepiece as spm
    from gguf import GGUFReader, GGUFValueType, GGUFWriter
    sp = spm.SentencePieceProcessor(model_file=model)
    r = GGUFReader(src)
    w = GGUFWriter(dst, arch=r.fields["general.architecture"].contents())
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k.startswith("tokenizer.") or k in ("general.architecture", "llama.vocab_size"):
            continue
        t = f.types[0]
        if t == GGUFValueType.ARRAY:
            w.add_key_value(k, f.contents(), t, sub_type=f.types[-1])
        else:
            w.add_key_value(k, f.contents(), t)
    n = sp.get_piece_size()
    types = [2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 5 if sp.is_unused(i) else 1
             for i in range(n)]
    w.add_tokenizer_model("llama")
    w.add_token_list([sp.id_to_piece(i) for i in range(n)])
    w.add_token_scores([sp.get_score(i) for i in range(n)])
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def hf_from_gguf(path, pre):
    """HF tokenizers built from a GGUF's vocab and merges with the pre-tokenizer `pre` names."""
    from gguf import GGUFReader
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    r = GGUFReader(path)
    toks = r.fields["tokenizer.ggml.tokens"].contents()
    merges = r.fields["tokenizer.ggml.merges"].contents()
    vocab = {t: i for i, t in enumerate(toks)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    llama3 = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
              "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
    qwen2 = llama3.replace("\\p{N}{1,3}", "\\p{N}")
    tok = Tokenizer(models.BPE(vocab, pairs, ignore_merges=(pre == "llama-bpe")))
    if pre == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(llama3 if pre == "llama-bpe" else qwen2), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return lambda b, special: tok.encode(b.decode("utf-8"), add_special_tokens=False).ids


def cross_check(name, cases, encode):
    bad = 0
    for c in cases:
        if c["flags"] & 2:
            continue  # HF splits added tokens regardless; llama.cpp only when asked
        text = open(os.path.join(ARGS.data, c["file"]), "rb").read() if "file" in c else c["text"].encode()
        ids = encode(text, False)
        if ids != c["ids"]:
            bad += 1
            pos = next((i for i, (a, b) in enumerate(zip(ids, c["ids"])) if a != b), min(len(ids), len(c["ids"])))
            print("  cross-check %s %s: HF differs at %d (HF %s vs ref %s)" %
                  (name, c["name"], pos, ids[pos:pos + 5], c["ids"][pos:pos + 5]))
    print("  cross-check %s: %d of %d cases differ from HF tokenizers" % (name, bad, len(cases)))


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.environ.get("KVCAL_DATA_DIR") or os.path.join(ROOT, "..", "shared", "data"))
    ap.add_argument("--model", default=os.path.join(ROOT, "data", "cache", "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--no-hf", action="store_true", help="skip the HF tokenizers cross-check")
    ARGS = ap.parse_args()
    out = os.path.join(HERE, "golden")
    os.makedirs(out, exist_ok=True)
    today = datetime.date.today().isoformat()

    import llama_cpp
    from llama_cpp import Llama
    with tempfile.TemporaryDirectory() as tmp:
        for pre, suffix in (("smollm", ""), ("llama-bpe", "_llama3"), ("qwen2", "_qwen2")):
            path = ARGS.model
            if pre != "smollm":
                path = os.path.join(tmp, "vocab_%s.gguf" % suffix)
                gguf_variant(ARGS.model, pre, path)
            m = Llama(model_path=path, vocab_only=True, verbose=False)
            enc = lambda b, special: m.tokenize(b, add_bos=False, special=special)
            cases = file_cases(ARGS.data, enc) + tricky_cases(enc, True)
            header = ["generated by tests/tokenizer/gen_reference.py on %s" % today,
                      "reference: llama.cpp via llama-cpp-python %s, vocab of %s, tokenizer.ggml.pre = %s" %
                      (llama_cpp.__version__, os.path.basename(ARGS.model), pre),
                      "tokenize(text, add_bos=False, special=(flags & 2)); ids hashed as little-endian int32"]
            write_golden(os.path.join(out, "smollm2%s.txt" % suffix), header, cases)
            if not ARGS.no_hf:
                cross_check("smollm2%s" % suffix, cases, hf_from_gguf(ARGS.model, pre))
            del m

        path = os.path.join(tmp, "stories_spm.gguf")
        spm_gguf(ARGS.model, os.path.join(ARGS.data, "stories260K", "tok512.model"), path)
        m = Llama(model_path=path, vocab_only=True, verbose=False)
        enc = lambda b, special: m.tokenize(b, add_bos=False, special=special)
        cases = file_cases(ARGS.data, enc) + tricky_cases(enc, False)
        header = ["generated by tests/tokenizer/gen_reference.py on %s" % today,
                  "reference: llama.cpp via llama-cpp-python %s, tok512.model's vocabulary as a GGUF "
                  "(tokenizer.ggml.model = llama)" % llama_cpp.__version__,
                  "tokenize(text, add_bos=False, special=False); ids hashed as little-endian int32"]
        write_golden(os.path.join(out, "stories260K_llamacpp.txt"), header, cases)
        del m

    import sentencepiece as spm
    model = os.path.join(ARGS.data, "stories260K", "tok512.model")
    sp = spm.SentencePieceProcessor(model_file=model)
    enc = lambda b, special: sp.encode(b.decode("utf-8"))
    cases = file_cases(ARGS.data, enc) + tricky_cases(enc, False)
    header = ["generated by tests/tokenizer/gen_reference.py on %s" % today,
              "reference: sentencepiece %s with stories260K/tok512.model (SentencePieceProcessor.encode)" %
              spm.__version__,
              "ids hashed as little-endian int32"]
    write_golden(os.path.join(out, "stories260K.txt"), header, cases)


if __name__ == "__main__":
    sys.exit(main())
