"""JSON Schema for values that a validator rewrites before pydantic checks them.

Config and workflow files accept short forms (``- researcher`` for ``{name: researcher}``,
``ttl: 30d``, ``rag: true``) that a ``BeforeValidator`` expands. Pydantic's JSON Schema
describes only the expanded form, so an editor using it would flag valid files. These
annotations make the printed schema (``marsys-mem schema``) accept what the loader
accepts:

* :class:`AlsoAccepts` adds alternatives to a type's own schema;
* :class:`SchemaAs` replaces it;
* :class:`SchemaOf` describes a value kept as a plain mapping (an agent's ``context``
  overrides) with the schema of the model it is checked against later.

Example:
    >>> from typing import Annotated
    >>> from pydantic import TypeAdapter
    >>> Names = Annotated[list[str], AlsoAccepts({"type": "string"})]
    >>> TypeAdapter(Names).json_schema()["anyOf"][0]
    {'type': 'string'}
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

__all__ = ["AlsoAccepts", "SchemaAs", "SchemaOf"]


class AlsoAccepts:
    """Annotation: the JSON Schema accepts ``schemas`` besides the type's own schema.

    Example:
        >>> from typing import Annotated
        >>> from pydantic import TypeAdapter
        >>> TypeAdapter(Annotated[int, AlsoAccepts({"type": "boolean"})]).json_schema()
        {'anyOf': [{'type': 'boolean'}, {'type': 'integer'}]}
    """

    def __init__(self, *schemas: dict[str, Any]) -> None:
        self.schemas = schemas

    def __get_pydantic_json_schema__(
        self, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        inner = handler(core_schema)
        forms = list(inner["anyOf"]) if set(inner) == {"anyOf"} else [inner]
        return {"anyOf": [*self.schemas, *forms]}


class SchemaAs:
    """Annotation: the JSON Schema is ``schema`` instead of the type's own.

    Example:
        >>> from datetime import timedelta
        >>> from typing import Annotated
        >>> from pydantic import TypeAdapter
        >>> TypeAdapter(Annotated[timedelta, SchemaAs({"type": "string"})]).json_schema()
        {'type': 'string'}
    """

    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = schema

    def __get_pydantic_json_schema__(
        self, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return dict(self.schema)


class SchemaOf:
    """Annotation: the JSON Schema is that of ``model`` (inlined, its own $defs shared).

    Example:
        >>> from typing import Annotated, Any
        >>> from pydantic import BaseModel, TypeAdapter
        >>> class Limits(BaseModel):
        ...     max_tokens: int = 100
        >>> schema = TypeAdapter(Annotated[dict[str, Any], SchemaOf(Limits)]).json_schema()
        >>> list(schema["properties"])
        ['max_tokens']
    """

    def __init__(self, model: type[BaseModel]) -> None:
        self.model = model

    def __get_pydantic_json_schema__(
        self, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return handler(self.model.__pydantic_core_schema__)
