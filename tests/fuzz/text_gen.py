"""Cheap, seeded text and value generators for the fuzzer's bodies (``random.Random`` driven).

Text is realistic and hostile at once: prose, numbered instruction lists, volatile lines (clock
readings, request ids), retrieved passages in the three forms the RAG pass recognises (tagged,
numbered, delimited), and unicode that breaks naive code (emoji, CJK, RTL, combining marks,
zero-width and line/paragraph separators, NUL). Numbers come as literal text (:class:`Num`) so
``1.10`` and integers beyond 64 bits reach the proxy byte for byte.
"""

from __future__ import annotations

import base64
import random

from tests.fuzz.jsontext import Num

WORDS = ("the", "order", "refund", "flight", "weather", "customer", "policy", "invoice", "ship",
         "contract", "version", "compare", "summarize", "error", "retry", "database", "table",
         "user", "account", "balance", "search", "result", "tool", "call", "Paris", "Berlin",
         "2024", "42", "alpha", "beta", "gamma", "delta", "please", "quickly", "careful")
ODD = ("é", "ß", "🙂", "👩‍💻", "漢字", "かな", "مرحبا", "שלום", "a\u0301", "\u200b", "\u2028",
       "\u2029", "\x00", "\t", "\\", "\"", "</script>", "{{x}}", "${HOME}", "\U0001f600", "Ω",
       "\r\n", "\ufeff", "𝕏")
VOLATILE = ("Current time: 2026-12-01T05:{m:02d}:{s:02d}Z", "request id: req_{h}",
            "session_id: sess_{h}", "Today is Tue, 01 Dec 2026 05:{m:02d}:{s:02d} +0000",
            "trace-id: {u}")
TAGS = ("document", "passage", "chunk", "search_result", "doc")


def words(r: random.Random, n: int) -> str:
    """``n`` words, sometimes with an odd unicode piece mixed in."""
    out = r.choices(WORDS, k=n)
    if r.random() < 0.3:
        for _ in range(r.randint(1, 3)):
            out.insert(r.randrange(len(out) + 1), r.choice(ODD))
    return " ".join(out)


def volatile_line(r: random.Random) -> str:
    """A clock reading or request id line (what hoist_volatile moves)."""
    h = f"{r.getrandbits(64):016x}"
    u = f"{r.getrandbits(32):08x}-{r.getrandbits(16):04x}-4{r.getrandbits(12):03x}-a{r.getrandbits(12):03x}-{r.getrandbits(48):012x}"
    return r.choice(VOLATILE).format(m=r.randrange(60), s=r.randrange(60), h=h, u=u)


def instruction_list(r: random.Random) -> str:
    """The user's own numbered / bulleted list (items that no pass may drop)."""
    n = r.randint(2, 6)
    mark = r.choice(("{i}. ", "- ", "* ", "({i}) "))
    base = words(r, r.randint(3, 8))
    items = [mark.format(i=i + 1) + (base if r.random() < 0.4 else words(r, r.randint(3, 8)))
             for i in range(n)]
    return "Requirements:\n" + "\n".join(items)


def passages(r: random.Random, delimiter: str) -> str:
    """A retrieval: 2-6 passages, tagged ``<document id=..>``, numbered ``[n]`` or delimited."""
    n = r.randint(2, 6)
    bodies = [words(r, r.randint(6, 30)) for _ in range(n)]
    if n > 2 and r.random() < 0.3:
        bodies[1] = bodies[0]  # an exact duplicate: the dedupe step's food
    form = r.randrange(3)
    if form == 0:
        tag = r.choice(TAGS)
        return "\n".join(f'<{tag} id="{i}">{b}</{tag}>' for i, b in enumerate(bodies))
    if form == 1:
        return "\n".join(f"[{i + 1}] {b}" for i, b in enumerate(bodies))
    return "Context:" + "".join(delimiter + b for b in bodies) + delimiter + "end of context"


def user_text(r: random.Random, delimiter: str) -> str:
    """A user turn's text: a question, maybe with an instruction list or a retrieval."""
    parts = [words(r, r.randint(1, 25))]
    roll = r.random()
    if roll < 0.2:
        parts.append(instruction_list(r))
    elif roll < 0.45:
        parts.append(passages(r, delimiter))
    if r.random() < 0.05:
        parts.append(words(r, 300))  # long: budgets are small, so pruning fires
    return "\n\n".join(parts)


def system_text(r: random.Random) -> str:
    """A system prompt: rules, sometimes a volatile line, sometimes 'always call X'."""
    lines = ["You are a helpful agent. " + words(r, r.randint(2, 20))]
    if r.random() < 0.5:
        lines.insert(r.randrange(len(lines) + 1), volatile_line(r))
    if r.random() < 0.2:
        lines.append(f"Always call {r.choice(TOOL_NAMES)} before answering.")
    if r.random() < 0.05:
        lines.append(words(r, 300))
    return "\n".join(lines)


TOOL_NAMES = tuple(f"{verb}_{noun}" for verb in ("get", "list", "create", "delete", "search")
                   for noun in ("weather", "order", "user", "flight", "invoice", "file", "repo"))


def number(r: random.Random) -> Num:
    """A number literal: small int, > 64-bit int, float with a trailing zero, exponent, -0."""
    roll = r.randrange(8)
    if roll == 0:
        return Num(str(r.randrange(10**20, 10**30)))
    if roll == 1:
        return Num(f"{r.randint(0, 99)}.{r.randint(0, 9)}0")
    if roll == 2:
        return Num("-" + str(2**64 + r.randrange(1000)))
    if roll == 3:
        return Num(r.choice(("1e400", "1.0E-7", "-0", "0.0", "1E+2", "123456789.123456789123")))
    if roll == 4:
        return Num(f"{r.random():.17f}")
    return Num(str(r.randint(-1000, 10**6)))


def scalar(r: random.Random) -> object:
    """A JSON scalar: number, string (odd unicode included), bool or null."""
    roll = r.randrange(5)
    if roll == 0:
        return number(r)
    if roll == 1:
        return words(r, r.randint(0, 4))
    if roll == 2:
        return r.random() < 0.5
    if roll == 3:
        return None
    return r.choice(ODD) + words(r, 1)


def value(r: random.Random, budget: int = 6) -> object:
    """A small JSON value (objects, arrays, scalars), at most ``budget`` leaves."""
    if budget <= 1 or r.random() < 0.5:
        return scalar(r)
    if r.random() < 0.5:
        return [value(r, budget // 2) for _ in range(r.randint(0, 3))]
    return {f"k{i}_{r.choice(WORDS)}": value(r, budget // 2) for i in range(r.randint(0, 3))}


def tool_args(r: random.Random) -> dict[str, object]:
    """Arguments of a tool call: ids beyond 64 bits, decimals with trailing zeros, text."""
    big = r.random() < 0.25
    args: dict[str, object] = {"order_id": Num(str(r.randrange(10**20, 10**30) if big else r.randrange(10**6))),
                               "amount": Num(f"{r.randint(1, 999)}.{r.randint(0, 9)}0")}
    if r.random() < 0.5:
        args["query"] = words(r, r.randint(1, 6))
    if r.random() < 0.3:
        args["nested"] = value(r)
    return args


def schema(r: random.Random) -> dict[str, object]:
    """A tool's JSON schema with numbers in it (``minimum: 1.10``, big ``maximum``)."""
    props: dict[str, object] = {}
    for name in r.sample(("order_id", "amount", "query", "city", "limit", "when"), r.randint(0, 4)):
        kind = r.choice(("string", "integer", "number", "boolean"))
        p: dict[str, object] = {"type": kind, "description": words(r, r.randint(1, 6))}
        if kind in ("integer", "number") and r.random() < 0.5:
            p["minimum"] = Num("1.10") if kind == "number" else Num("0")
            p["maximum"] = Num(str(10**25))
        if kind == "string" and r.random() < 0.3:
            p["enum"] = [words(r, 1) for _ in range(r.randint(1, 3))]
        props[name] = p
    out: dict[str, object] = {"type": "object", "properties": props}
    if props and r.random() < 0.5:
        out["required"] = sorted(props)[:1]
    return out


def deep(n: int) -> str:
    """``n`` nested arrays as JSON text (built as text: no recursion)."""
    return "[" * n + "1" + "]" * n


def base64ish(r: random.Random, n: int) -> str:
    """``n`` base64 characters (not a real image: the upstream is a recorder)."""
    return base64.b64encode(r.randbytes(n * 3 // 4)).decode()
