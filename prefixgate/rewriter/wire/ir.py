"""The prompt IR shared by both wire APIs (OpenAI Chat Completions, Anthropic Messages).

The IR is a thin, *lossless* view over the wire JSON. Every node keeps the wire dict it came
from (``raw``, key order kept) and exposes the fields passes need (role, block type, text, tool
ids, ``cache_control``). Rendering writes modelled fields back into a copy of ``raw`` at their
original key positions, so ``render(parse(body))`` is ``json.dumps``-identical to ``body``.

Shapes::

    Prompt(api, tools: list[Tool] | None, system: list[Message], messages: list[Message],
           params: dict (every other top-level key), key_order: list[str])
    Message(role, blocks: list[Block], form: "string"|"list"|"null"|"absent", raw: dict)
    Block(type, raw: dict, volatile: bool)
    Tool(raw: dict)

* Anthropic ``system`` (string or block list) is one ``Message(role="system")`` in
  ``Prompt.system``; OpenAI's *leading* ``system``/``developer`` messages are ``Prompt.system``
  (a later system message stays in ``messages`` where it was).
* OpenAI ``tool_calls`` entries are ``Block(type="tool_use")`` whose ``raw`` is the tool-call dict
  (``{"id","type":"function","function":{"name","arguments"}}``); they render back into the
  message's ``tool_calls`` key. An OpenAI ``role: "tool"`` message keeps ``tool_call_id`` in
  ``raw`` (see :func:`tool_result_ids`).
* A string ``content`` is one synthetic text block; it renders back to a string as long as all
  blocks are plain text blocks without extra keys.
* Image, audio, file and document blocks are opaque: their ``raw`` dict is referenced, never
  copied or read as text.

IR objects are immutable by convention: passes build new ``Prompt``/``Message``/``Block`` objects
(``dataclasses.replace``, :func:`with_key`) and never mutate a ``raw`` dict in place, so a pass can
always be reverted by keeping its input.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Literal

Api = Literal["openai", "anthropic"]
ContentForm = Literal["string", "list", "null", "absent"]

TEXT_TYPES = frozenset({"text", "input_text", "output_text"})
OPAQUE_TYPES = frozenset(
    {"image", "image_url", "input_image", "input_audio", "audio", "file", "document",
     "input_file", "container_upload"}
)


def with_key(d: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """Copy of ``d`` with ``key`` set: kept at its position if present, else appended."""
    out = dict(d)
    out[key] = value
    return out


def without_key(d: dict[str, Any], key: str) -> dict[str, Any]:
    """Copy of ``d`` without ``key`` (order of the other keys kept)."""
    return {k: v for k, v in d.items() if k != key}


@dataclass(frozen=True)
class Block:
    """One content block.

    ``type``: the wire ``type`` (``"text"``, ``"image"``, ``"tool_use"``, ``"tool_result"``,
    ``"thinking"``, ...), ``"text"`` for a string content, ``"tool_use"`` for an OpenAI tool call.
    ``raw``: the wire dict. ``volatile``: IR-only flag (never rendered) set by passes on blocks
    that change every request (e.g. the hoisted-volatile note), so no breakpoint lands on them.
    ``synthetic``: True when the block stands for a plain string content.
    """

    type: str
    raw: dict[str, Any]
    volatile: bool = False
    synthetic: bool = False

    @staticmethod
    def text_block(text: str, *, volatile: bool = False) -> Block:
        """A new ``{"type":"text","text": text}`` block."""
        return Block("text", {"type": "text", "text": text}, volatile=volatile)

    @property
    def is_text(self) -> bool:
        """True for plain text blocks (``text`` / ``input_text`` / ``output_text``)."""
        return self.type in TEXT_TYPES and isinstance(self.raw.get("text"), str)

    @property
    def is_opaque(self) -> bool:
        """True for media blocks (images, audio, files, documents): never read as text."""
        return self.type in OPAQUE_TYPES

    @property
    def text(self) -> str:
        """Text of a text block, thinking text of a thinking block, else ``""``."""
        if self.is_text:
            return str(self.raw["text"])
        if self.type == "thinking" and isinstance(self.raw.get("thinking"), str):
            return str(self.raw["thinking"])
        return ""

    def with_text(self, text: str) -> Block:
        """Copy of a text block with new text (raises ``ValueError`` on other blocks)."""
        if not self.is_text:
            raise ValueError(f"with_text on a {self.type!r} block")
        return replace(self, raw=with_key(self.raw, "text", text))

    @property
    def cache_control(self) -> dict[str, Any] | None:
        """The block's ``cache_control`` marker, if any."""
        cc = self.raw.get("cache_control")
        return cc if isinstance(cc, dict) else None

    def with_cache_control(self, cc: dict[str, Any] | None) -> Block:
        """Copy with ``cache_control`` set (appended as the last key) or removed (``None``)."""
        raw = without_key(self.raw, "cache_control") if cc is None else with_key(
            self.raw, "cache_control", cc)
        return replace(self, raw=raw, synthetic=False if cc is not None else self.synthetic)

    @property
    def tool_id(self) -> str | None:
        """``id`` of a tool_use block / OpenAI tool call; ``tool_use_id`` of a tool_result."""
        key = "tool_use_id" if self.type == "tool_result" else "id"
        v = self.raw.get(key)
        return v if isinstance(v, str) else None

    @property
    def tool_name(self) -> str | None:
        """Tool name of a tool_use block (Anthropic ``name``, OpenAI ``function.name``)."""
        fn = self.raw.get("function")
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            return str(fn["name"])
        if isinstance(self.raw.get("name"), str):
            return str(self.raw["name"])
        return None

    def result_text(self) -> str:
        """Text inside a tool_result block (string content or its text sub-blocks)."""
        c = self.raw.get("content")
        if isinstance(c, str):
            return c
        if isinstance(c, list):
            return "".join(str(b.get("text", "")) for b in c
                           if isinstance(b, dict) and b.get("type") == "text")
        return ""


@dataclass(frozen=True)
class Message:
    """One message (or Anthropic's ``system`` as ``role="system"``).

    ``form``: how ``content`` was on the wire: ``"string"``, ``"list"``, ``"null"`` (JSON null)
    or ``"absent"`` (no ``content`` key). ``raw``: the wire dict (for Anthropic system: ``{}``).
    """

    role: str
    blocks: tuple[Block, ...]
    form: ContentForm
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """Concatenated text of the text blocks (no separators)."""
        return "".join(b.text for b in self.blocks if b.is_text)

    @property
    def tool_call_id(self) -> str | None:
        """OpenAI ``role: "tool"`` message's ``tool_call_id``."""
        v = self.raw.get("tool_call_id")
        return v if isinstance(v, str) else None

    def with_blocks(self, blocks: list[Block] | tuple[Block, ...]) -> Message:
        """Copy with new blocks (form kept; a string form renders back to a string when it can)."""
        form: ContentForm = self.form
        if form in ("null", "absent") and any(b.type != "tool_use" for b in blocks):
            form = "list"
        return replace(self, blocks=tuple(blocks), form=form)


@dataclass(frozen=True)
class Tool:
    """One tool definition, wire dict in ``raw``.

    OpenAI: ``{"type":"function","function":{"name","description","parameters",...}}``;
    Anthropic: ``{"name","description","input_schema",...}`` or a server tool
    ``{"type":"web_search_20250305","name":"web_search"}``.
    """

    raw: dict[str, Any]

    @property
    def _inner(self) -> dict[str, Any]:
        for key in ("function", "custom"):
            v = self.raw.get(key)
            if isinstance(v, dict):
                return v
        return self.raw

    @property
    def name(self) -> str:
        """Tool name (``""`` if missing)."""
        v = self._inner.get("name")
        return v if isinstance(v, str) else ""

    @property
    def description(self) -> str:
        """Tool description (``""`` if missing)."""
        v = self._inner.get("description")
        return v if isinstance(v, str) else ""

    @property
    def schema(self) -> Any:
        """The argument JSON schema (``parameters`` / ``input_schema`` / ``inputSchema``)."""
        inner = self._inner
        for key in ("parameters", "input_schema", "inputSchema"):
            if key in inner:
                return inner[key]
        return None

    @property
    def cache_control(self) -> dict[str, Any] | None:
        """The tool's ``cache_control`` marker (Anthropic), if any."""
        cc = self.raw.get("cache_control")
        return cc if isinstance(cc, dict) else None

    def with_cache_control(self, cc: dict[str, Any] | None) -> Tool:
        """Copy with ``cache_control`` set (appended) or removed (``None``)."""
        if cc is None:
            return Tool(without_key(self.raw, "cache_control"))
        return Tool(with_key(self.raw, "cache_control", cc))


@dataclass(frozen=True)
class Prompt:
    """A whole request body in IR form.

    ``tools``: ``None`` when the body has no ``tools`` key. ``params``: every other top-level
    key not modelled (``model``, ``max_tokens``, ``tool_choice``, ``stream``, ...), in wire
    order. ``key_order``: the body's top-level key order, used by rendering.
    """

    api: Api
    tools: tuple[Tool, ...] | None
    system: tuple[Message, ...]
    messages: tuple[Message, ...]
    params: dict[str, Any]
    key_order: tuple[str, ...]
    system_present: bool = True

    @property
    def model(self) -> str:
        """``params["model"]`` or ``""``."""
        v = self.params.get("model")
        return v if isinstance(v, str) else ""

    def with_param(self, key: str, value: Any) -> Prompt:
        """Copy with a top-level parameter set (kept in place, or appended when new)."""
        return replace(self, params=with_key(self.params, key, value))


# ---------------------------------------------------------------------------------------------
# Uniform queries used by passes and validators (both APIs).
# ---------------------------------------------------------------------------------------------


def tool_use_ids(msg: Message) -> list[str]:
    """Ids of the tool calls a message makes (Anthropic ``tool_use`` / OpenAI ``tool_calls``)."""
    return [b.tool_id or "" for b in msg.blocks if b.type in ("tool_use", "server_tool_use")]


def tool_result_ids(msg: Message) -> list[str]:
    """Ids a message answers: ``tool_result.tool_use_id`` blocks, or an OpenAI tool message's id."""
    if msg.role == "tool":
        return [msg.tool_call_id or ""]
    return [b.tool_id or "" for b in msg.blocks if b.type == "tool_result"]


def used_tool_names(prompt: Prompt) -> set[str]:
    """Names of tools called anywhere in the history (client tools; server tool uses excluded)."""
    names: set[str] = set()
    for m in prompt.messages:
        for b in m.blocks:
            if b.type == "tool_use" and b.tool_name:
                names.add(b.tool_name)
    return names


def tool_choice_name(prompt: Prompt) -> str | None:
    """Tool named by ``tool_choice`` (either API's shape), or ``None``."""
    tc = prompt.params.get("tool_choice")
    if not isinstance(tc, dict):
        return None
    fn = tc.get("function")
    if isinstance(fn, dict) and isinstance(fn.get("name"), str):
        return str(fn["name"])
    name = tc.get("name")
    return name if isinstance(name, str) else None


def iter_blocks(prompt: Prompt) -> Iterator[tuple[str, int, int, Block | Tool]]:
    """Every cacheable unit in prompt order: ``(region, msg_index, block_index, node)``.

    ``region`` is ``"tools"`` (msg_index = -1, block_index = tool index), ``"system"`` or
    ``"messages"`` (msg_index into ``prompt.system`` / ``prompt.messages``). This is the block
    order Anthropic's cache prefix follows: tools, then system, then messages.
    """
    for i, t in enumerate(prompt.tools or ()):
        yield "tools", -1, i, t
    for mi, m in enumerate(prompt.system):
        for bi, b in enumerate(m.blocks):
            yield "system", mi, bi, b
    for mi, m in enumerate(prompt.messages):
        for bi, b in enumerate(m.blocks):
            yield "messages", mi, bi, b
