"""The tokenizer golden corpus, shared by make_golden.py (Hugging Face `tokenizers` reference for
the BPE models) and make_gemma_golden.py (llama.cpp reference for Gemma's SentencePiece).

CORPUS is hand-written (scripts, emoji, CJK, whitespace runs, code, special-token text);
random_corpus(n, pieces) draws reproducible strings from pieces that exercise the splitters.
"""

CORPUS = [
    "The capital of France is",
    " Paris",
    "144",
    "Romeo",
    "Romeo and Juliet",
    "",
    " ",
    "  ",
    "\n",
    "\n\n\n",
    "\t",
    "\t\t\tx",
    "trailing spaces   ",
    "trailing newlines\n\n",
    "   leading spaces",
    "a  b   c    d",
    "line one\nline two\r\nline three\rline four",
    "mixed \t \n \t\n  whitespace",
    "end with tab\t",
    "Hello, world!",
    "Hello world! How are you doing today? I'm fine, thanks.",
    "I'm, you're, he's, we've, they'll, she'd, it'd've, DON'T, I'M, You'Re",
    "'s 't 're 've 'm 'll 'd '",
    "rock'n'roll o'clock",
    "1234567890",
    "3.14159 2.71828 -42 +7 1e-9 0x1F 0b1010",
    "1,000,000 and 12,345.67",
    "Year 2024: 365 days, 8760 hours.",
    "٣٤٥ ½ Ⅻ ²³ ①②",
    "naïve café résumé Ångström façade coöperate",
    "e\u0301 a\u0300 n\u0303 (decomposed accents)",
    "Größe Straße ÆØÅ æøå œuvre",
    "Привет, мир! Как дела?",
    "Γειά σου Κόσμε",
    "你好，世界！今天天气很好。",
    "こんにちは、世界。カタカナとひらがな。",
    "안녕하세요 세계",
    "مرحبا بالعالم",
    "שלום עולם",
    "नमस्ते दुनिया",
    "สวัสดีชาวโลก",
    "Emoji: 😀😃😄 👋🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ ✨",
    "🤖",
    "a😀b",
    "math: ∑_{i=1}^{n} x_i ≤ ∞, α+β=γ, √2 ≈ 1.414",
    "symbols: ~!@#$%^&*()_+`-={}[]|\\:\";'<>?,./",
    "arrows → ← ↑ ↓ ⇒ and dashes – — and quotes “smart” ‘single’ «guillemets»",
    "non\u00a0breaking\u00a0space and zero\u200bwidth and\u3000ideographic space",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "fn main() {\n\tlet v: Vec<u32> = (0..10).map(|x| x * x).collect();\n\tprintln!(\"{:?}\", v);\n}\n",
    '{"key": "value", "list": [1, 2, 3], "nested": {"a": null, "b": true}}',
    "<html>\n  <body class=\"main\">\n    <p>Hi &amp; bye</p>\n  </body>\n</html>",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    "    indented\n        more indented\n\n\n\n    back",
    "https://example.com/path?query=1&other=two#frag user@example.org",
    "camelCaseIdentifier snake_case_identifier SCREAMING_CASE kebab-case",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>",
    "<|endoftext|>",
    "before<|endoftext|>after",
    "<|im_end|><|im_end|>",
    " <|im_start|> spaced <|im_end|> ",
    "<|im_start partial special <|im_end and |> stray",
    "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
    "<repo_name>aeon<file_sep>main.rs",
    "<tool_call>{\"name\": \"f\"}</tool_call>",
    "ALL CAPS TEXT AND MiXeD cAsE",
    "!!!???...,,,;;;",
    "a\n\nb\n\n\nc \n d\t\ne",
    "x" * 300,
    " ".join(["word"] * 50),
]


# Pieces the random strings are made of: every character class the split patterns treat
# differently, runs of whitespace, contractions, and fragments of special tokens.
RANDOM_PIECES = [
    "a", "Z", "word", " the", "Ünïcödé", "ß", "ǅ", "ſ", "K", "'", "'s", "'LL", "'ve", "'ſ", "'K",
    "0", "7", "42", "٣", "½", "Ⅻ", " ", "  ", "\n", "\r\n", "\t", "\u00a0", "\u3000", "\u200b",
    ".", ",", "!?", "...", "(", ")", "{}", "_", "-", "+", "#", "@", "$", "€", "©", "→", "∑",
    "中", "文字", "の", "한", "Ω", "й", "ا", "ע", "क्ष", "e\u0301", "\u0301", "😀", "👋🏽", "🇫🇷",
    "‍", "️", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|", "|>", "<tool_call>", "<file_sep>",
    "\x00", "\x04", "\x7f",
]


def random_corpus(n, seed=4, pieces=None):
    """`n` reproducible random strings of 1 to 12 pieces (RANDOM_PIECES by default)."""
    import random

    rng = random.Random(seed)
    return ["".join(rng.choice(pieces or RANDOM_PIECES) for _ in range(rng.randint(1, 12))) for _ in range(n)]
