"""/v1/chat/completions: messages (and tools) rendered with the chat template, answered streamed
or whole; with tools (tool_choice not none), the answer's tool calls parsed into `tool_calls`."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from hotspec.entrypoints import logprobs_format as lpf
from hotspec.entrypoints import openai_format as fmt
from hotspec.entrypoints.api_errors import APIError
from hotspec.entrypoints.offload import run_sized
from hotspec.entrypoints.protocol import ChatCompletionRequest
from hotspec.entrypoints.request_checks import parse_request
from hotspec.entrypoints.server_state import ServerState
from hotspec.entrypoints.submission import answer
from hotspec.entrypoints.tool_request import template_supports_tools

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def add_routes(app: FastAPI, s: ServerState) -> None:
    texts = lpf.token_texts(s.tokenizer)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await parse_request(request, s.settings, ChatCompletionRequest)
        ids = await _tokenize(s.tokenizer, [m.as_template_input() for m in body.messages],
                              _template_tools(s.tokenizer, body))
        tools = body.parses_tool_calls
        return await answer(request, s, body, ids,
                            default_max_tokens=s.max_model_len,  # up to the context limit
                            id_prefix="chatcmpl-", chunks=functools.partial(fmt.chat_chunks, tools=tools),
                            whole=functools.partial(fmt.chat_completion_choices, tools=tools),
                            logprobs=functools.partial(lpf.ChatLogprobs, texts))


def _template_tools(tok: PreTrainedTokenizerBase | None,
                    body: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    """The tools for the chat template; a template that does not render tools is a 400, unless
    tool_choice is none (the tools are then only context, which such a template drops anyway)."""
    tools = body.template_tools()
    if tools is None or tok is None or template_supports_tools(tok.chat_template):
        return tools
    if body.effective_tool_choice == "none":
        return None
    raise APIError(400, "this model's chat template does not support tools (it never renders "
                   "them); send the request without tools, or serve a model whose template "
                   "defines tool calls", param="tools")


async def _tokenize(tok: PreTrainedTokenizerBase | None, messages: list[dict[str, Any]],
                    tools: list[Any] | None = None) -> list[int]:
    if tok is None:
        raise APIError(400, "this server has no tokenizer (skip_tokenizer_init): use "
                       "/v1/completions with token ids", param="messages")

    def render() -> list[int]:  # same as LLM.chat
        text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
        return tok.encode(text, add_special_tokens=False)

    try:
        return await run_sized(render, sum(len(str(m.get("content") or "")) for m in messages)
                               + (len(str(tools)) if tools else 0))
    except Exception as e:  # noqa: BLE001 - jinja raises its own errors from inside the template
        if type(e).__module__.startswith("jinja2") or isinstance(e, ValueError):
            raise APIError(400, f"the chat template rejected these messages: {e}",
                           param="messages") from None
        raise
