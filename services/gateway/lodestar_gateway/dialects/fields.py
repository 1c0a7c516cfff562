"""Typed access to decoded JSON request bodies; every failure names the offending field path.

Dialect parsers use these instead of bare indexing so that wrong types, missing fields and unknown
fields become `InvalidArgumentError`s (HTTP 400 in the dialect's error shape), never crashes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from lodestar.errors import InvalidArgumentError

JsonObject = dict[str, Any]

_TYPE_NAMES = {str: "a string", bool: "a boolean", dict: "an object", list: "an array"}


def fail(path: str, message: str) -> InvalidArgumentError:
    """An error naming the field: `messages.0.content: expected an array`."""
    return InvalidArgumentError(f"{path}: {message}" if path else message)


def join(path: str, key: str | int) -> str:
    return f"{path}.{key}" if path else str(key)


def expect_object(value: Any, path: str) -> JsonObject:
    if not isinstance(value, dict):
        raise fail(path, f"expected an object, got {type_name(value)}")
    return value


def type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def unknown_fields(obj: JsonObject, allowed: Iterable[str] | frozenset[str]) -> list[str]:
    """The keys of `obj` the vendor API does not define (the caller decides: accept or refuse, see
    `lodestar_gateway.unknown_fields`)."""
    allowed_set = allowed if isinstance(allowed, frozenset) else frozenset(allowed)
    return [key for key in obj if key not in allowed_set]


def req(obj: JsonObject, key: str, path: str = "") -> Any:
    if key not in obj or obj[key] is None:
        raise fail(join(path, key), "field required")
    return obj[key]


def string(obj: JsonObject, key: str, path: str = "", *, required: bool = False) -> str | None:
    value = req(obj, key, path) if required else obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise fail(join(path, key), f"expected a string, got {type_name(value)}")
    return value


def boolean(obj: JsonObject, key: str, path: str = "") -> bool | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise fail(join(path, key), f"expected a boolean, got {type_name(value)}")
    return value


def number(
    obj: JsonObject, key: str, path: str = "", *, minimum: float | None = None, maximum: float | None = None
) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise fail(join(path, key), f"expected a number, got {type_name(value)}")
    if minimum is not None and value < minimum:
        raise fail(join(path, key), f"must be >= {minimum:g}, got {value:g}")
    if maximum is not None and value > maximum:
        raise fail(join(path, key), f"must be <= {maximum:g}, got {value:g}")
    return float(value)


def integer(
    obj: JsonObject, key: str, path: str = "", *, minimum: int | None = None, required: bool = False
) -> int | None:
    value = req(obj, key, path) if required else obj.get(key)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(join(path, key), f"expected an integer, got {type_name(value)}")
    if minimum is not None and value < minimum:
        raise fail(join(path, key), f"must be >= {minimum}, got {value}")
    if value > 2**31 - 1:
        raise fail(join(path, key), f"must be < 2^31, got {value}")
    return value


def array(obj: JsonObject, key: str, path: str = "", *, required: bool = False) -> list[Any] | None:
    value = req(obj, key, path) if required else obj.get(key)
    if value is None:
        return None
    if not isinstance(value, list):
        raise fail(join(path, key), f"expected an array, got {type_name(value)}")
    return value


def obj(parent: JsonObject, key: str, path: str = "", *, required: bool = False) -> JsonObject | None:
    value = req(parent, key, path) if required else parent.get(key)
    if value is None:
        return None
    return expect_object(value, join(path, key))


def string_list(parent: JsonObject, key: str, path: str = "") -> list[str]:
    """A string or an array of strings (stop sequences)."""
    value = parent.get(key)
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise fail(join(path, key), f"expected a string or an array of strings, got {type_name(value)}")
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise fail(join(join(path, key), index), f"expected a string, got {type_name(item)}")
    return list(value)
