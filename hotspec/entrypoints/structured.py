"""Structured output's request fields, for chat and completions alike: OpenAI's `response_format`
(`text`, `json_object`, `json_schema`) and the extension fields that name a grammar directly:
vLLM's `guided_json` (a JSON schema, as an object or its text), `guided_regex`, `guided_grammar`
(EBNF) and `structural_tag` (xgrammar's JSON), and SGLang's `regex` and `ebnf`.

Each one sent becomes a GrammarSpec whose `field` is the request field it came from, so a grammar
that does not compile is refused with a 400 naming that field. A request constrains its output
with at most one of them (protocol.py checks, together with chat's tool_choice).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, model_validator

from hotspec.sampling_params import GrammarSpec

Text = Annotated[StrictStr, Field(min_length=1)]  # a grammar's text: never empty


class JsonSchemaFormat(BaseModel):
    """response_format.json_schema: OpenAI's named schema; `strict` and `description` change
    nothing (the output always matches the schema)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    name: StrictStr
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None
    description: StrictStr | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type json_schema needs the json_schema object ({name, schema})")
        return self


class StructuredFields(BaseModel):
    """The fields above, declared on both request models."""

    response_format: ResponseFormat | None = None
    guided_json: dict[str, Any] | Text | None = None  # extension (vLLM)
    guided_regex: Text | None = None  # extension (vLLM)
    guided_grammar: Text | None = None  # extension (vLLM): EBNF, root rule `root`
    structural_tag: dict[str, Any] | Text | None = None  # extension (vLLM): xgrammar's JSON
    regex: Text | None = None  # extension (SGLang)
    ebnf: Text | None = None  # extension (SGLang)

    def output_grammars(self) -> list[GrammarSpec]:
        """One GrammarSpec per grammar field sent (`response_format` text is none)."""
        specs = []
        rf = self.response_format
        if rf is not None and rf.type == "json_object":
            specs.append(GrammarSpec("json_object", field="response_format"))
        elif rf is not None and rf.json_schema is not None:
            schema = rf.json_schema.schema_
            specs.append(GrammarSpec("json_object", field="response_format") if schema is None else
                         GrammarSpec("json_schema", json.dumps(schema),
                                     field="response_format.json_schema.schema"))
        for name, kind in (("guided_json", "json_schema"), ("guided_regex", "regex"),
                           ("guided_grammar", "ebnf"), ("structural_tag", "structural_tag"),
                           ("regex", "regex"), ("ebnf", "ebnf")):
            value = getattr(self, name)
            if value is not None:
                specs.append(GrammarSpec(kind, value if isinstance(value, str) else json.dumps(value),
                                         field=name))
        return specs
