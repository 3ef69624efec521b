"""Tool calling's request side (chat only): `tools`, `tool_choice`, `parallel_tool_calls`, and the
messages that carry earlier calls (an assistant's `tool_calls`, a `tool` message's
`tool_call_id`), as the chat template takes them.

Calls are written the Hermes / Qwen2.5 way, `<tool_call>\\n{"name": ..., "arguments": {...}}\\n
</tool_call>`, one after another (tool_parser.py reads them back). tool_choice:
- `auto` (the default with tools): the tools are in the prompt, the output is free; calls in it
  are parsed into `tool_calls`.
- `required` / a named function: the output is constrained by a grammar (a structural tag) to be
  calls, one or more (`required` with parallel_tool_calls) or exactly one, of the allowed
  functions, their arguments valid under each function's `parameters` JSON schema.
- `none`: as vLLM does, the tools are still given to the chat template (the conversation may
  refer to them), the output is neither constrained nor parsed: it is the message's content.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, StrictBool, StrictStr

from hotspec.entrypoints.param_errors import InvalidParameterError
from hotspec.sampling_params import GrammarSpec

CALL_BEGIN, CALL_END = "<tool_call>", "</tool_call>"
CALL_SEPARATOR = "\n"  # between two calls, as the Qwen2.5 template writes them
ANY_OBJECT: dict[str, Any] = {"type": "object"}  # a function that declares no parameters


class _Part(BaseModel):
    """A part of a request: fields it does not declare are ignored (OpenAI adds them often)."""

    model_config = ConfigDict(extra="ignore")


class FunctionDef(_Part):
    name: StrictStr
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments object
    strict: StrictBool | None = None


class Tool(_Part):
    type: Literal["function"]
    function: FunctionDef


class FunctionName(_Part):
    name: StrictStr


class NamedToolChoice(_Part):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class FunctionCall(_Part):
    name: StrictStr
    arguments: StrictStr  # JSON text, as the API returns it


class ToolCall(_Part):
    """A call of an earlier assistant message."""

    id: StrictStr | None = None
    type: Literal["function"] = "function"
    function: FunctionCall

    def as_template_input(self) -> dict[str, Any]:
        """The call as chat templates read it: `arguments` an object (templates write it with
        `tojson`), as vLLM passes it; arguments that are not JSON stay text."""
        try:
            arguments: Any = json.loads(self.function.arguments)
        except json.JSONDecodeError:
            arguments = self.function.arguments
        call: dict[str, Any] = {"type": "function",
                                "function": {"name": self.function.name, "arguments": arguments}}
        if self.id is not None:
            call["id"] = self.id
        return call


class ToolFields(BaseModel):
    """The chat request's tool fields."""

    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None

    @property
    def effective_tool_choice(self) -> str | NamedToolChoice:
        """OpenAI's default: `auto` with tools, `none` without."""
        if self.tool_choice is not None:
            return self.tool_choice
        return "auto" if self.tools else "none"

    def template_tools(self) -> list[dict[str, Any]] | None:
        """The tools as the chat template takes them (None: no tools)."""
        if not self.tools:
            return None
        return [t.model_dump(exclude_none=True) for t in self.tools]

    @property
    def parses_tool_calls(self) -> bool:
        """Whether the output's calls become `tool_calls` (tools given, tool_choice not none)."""
        return bool(self.tools) and self.effective_tool_choice != "none"

    def check_tools(self) -> None:
        """tool_choice fits the tools: required or a name needs tools, a name one of them."""
        choice, names = self.effective_tool_choice, [t.function.name for t in self.tools or ()]
        if choice in ("none", "auto"):
            return
        if not names:
            raise InvalidParameterError("tool_choice", f"tool_choice {_choice_text(choice)} needs "
                                        "tools: send the functions the model may call")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise InvalidParameterError("tool_choice", f"tool_choice names the function "
                                        f"{choice.function.name!r}, which is not in tools "
                                        f"({', '.join(map(repr, names))})")

    def tool_grammar(self) -> GrammarSpec | None:
        """The grammar of tool_choice required or named (None otherwise): see the module doc."""
        choice, tools = self.effective_tool_choice, self.tools or []
        if isinstance(choice, NamedToolChoice):
            i = next(i for i, t in enumerate(tools) if t.function.name == choice.function.name)
            return _structural_tag(call_tag(tools[i].function), f"tools.{i}.function.parameters")
        if choice != "required" or not tools:
            return None
        tags = [call_tag(t.function) for t in tools]
        if self.parallel_tool_calls is False:
            fmt = tags[0] if len(tags) == 1 else {"type": "or", "elements": tags}
        else:
            fmt = {"type": "tags_with_separator", "tags": tags, "separator": CALL_SEPARATOR,
                   "at_least_one": True}
        return _structural_tag(fmt, "tools")


def call_tag(function: FunctionDef) -> dict[str, Any]:
    """A structural-tag `tag`: one call of `function`, its arguments under its parameters'
    schema (xgrammar's Hermes / Qwen format: the name fixed in `begin`, the arguments object as
    the content, the outer object's `}` in `end`)."""
    return {"type": "tag",
            "begin": f'{CALL_BEGIN}\n{{"name": {json.dumps(function.name)}, "arguments": ',
            "content": {"type": "json_schema", "json_schema": function.parameters or ANY_OBJECT},
            "end": f"}}\n{CALL_END}"}


def _structural_tag(fmt: dict[str, Any], field: str) -> GrammarSpec:
    return GrammarSpec("structural_tag", json.dumps({"type": "structural_tag", "format": fmt}),
                       field=field)


def _choice_text(choice: str | NamedToolChoice) -> str:
    return repr(choice) if isinstance(choice, str) else f"function {choice.function.name!r}"


def template_supports_tools(template: Any) -> bool:
    """Whether a chat template (its text, or a dict of named templates) renders `tools`."""
    return "tools" in (template if isinstance(template, str) else json.dumps(template or ""))
