"""The machinery of the event catalogue: the payload base class, opaque payloads, the
``EventCatalogue`` and the process-wide instance.

Import ``terret.domain.catalogue`` rather than this module: it also registers Terret's own
events (``terret.domain.events``, which imports this module), so whoever reads the catalogue
finds them. This module imports no event, so there is no import cycle.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from typing import Any, ClassVar, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo
from pydantic_core import ErrorDetails, PydanticSerializationError

from terret.domain.errors import (
    ConfigurationError,
    DuplicateEventType,
    InvalidPayload,
    require_flags,
)


def _first_error(exc: ValidationError) -> tuple[str, str]:
    error = exc.errors()[0]
    loc = ".".join(str(part) for part in error.get("loc", ())) or "<payload>"
    return loc, str(error.get("msg", "invalid"))


def describe_validation(exc: ValidationError, root: str) -> str:
    """A validation error as ``field: message; ...`` (``root`` for the whole input), in the
    validators' own words and without the input values pydantic quotes: what is refused may be
    shown to a model, printed or logged, and the input may be a key."""
    return "; ".join(
        f"{'.'.join(str(part) for part in error['loc']) or root}: {_message(error)}"
        for error in exc.errors(include_url=False, include_input=False)
    )


def _message(error: ErrorDetails) -> str:
    # A validator's ValueError without pydantic's "Value error, " in front of it.
    raised = error.get("ctx", {}).get("error")
    return str(raised) if error["type"] == "value_error" and raised else error["msg"]


_CREATING: dict[str, Any] = {"terret": "creating"}
"""The validation context of a payload created in code (``EventPayload(...)``); decoding a stored
one validates without it."""


def validated(model: BaseModel, name: str, data: dict[str, Any]) -> None:
    """``model`` (being made) validated from ``data`` in the context of a payload being created,
    each refusal an ``InvalidPayload`` of ``name``: bytes where text goes first — pydantic would
    decode them, and a value given as bytes is not the text the caller meant to record. (A
    field typed ``bytes`` — ``Base64Bytes``, say — takes them, as declared.)"""
    takes_bytes = _bytes_fields(type(model))
    for key, value in data.items():
        if key not in takes_bytes:
            where = _bytes_at(value, str(key))
            if where is not None:
                raise InvalidPayload(name, where, "text, not bytes")
    try:
        model.__pydantic_validator__.validate_python(data, self_instance=model,
                                                     context=_CREATING)
    except ValidationError as exc:
        loc, msg = _first_error(exc)
        raise InvalidPayload(name, loc, msg) from None


@cache
def _bytes_fields(cls: type[BaseModel]) -> frozenset[str]:
    """The fields of ``cls`` typed to take bytes (``bytes``, ``Base64Bytes``): once per class,
    not per payload made."""
    return frozenset(name for name, info in cls.model_fields.items()
                     if "bytes" in repr(info.annotation).lower())


_BYTES = bytes | bytearray | memoryview


def _bytes_at(value: Any, loc: str, depth: int = 0) -> str | None:
    """Where ``value`` holds bytes (a few levels of dicts and lists down), or None."""
    if isinstance(value, _BYTES):
        return loc
    if depth >= 4:
        return None
    if isinstance(value, dict):
        items: Iterable[tuple[Any, Any]] = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        if isinstance(item, _BYTES | dict | list | tuple):
            found = _bytes_at(item, f"{loc}.{key}" if loc else str(key), depth + 1)
            if found is not None:
                return found
    return None


def creating(info: ValidationInfo) -> bool:
    """In a field validator: whether the payload is being created (to be written), not read.

    Rules added to a payload's text (pattern, spec and name syntax) are checked when an event is
    created; a stored event is read as written, so a record an older release accepted stays
    readable (its types are still checked)."""
    return info.context is _CREATING


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored, or None. Stored text is UTF-8, and a lone surrogate has no
    UTF-8 encoding: it is what bytes that are not UTF-8 become in a command line's arguments
    (Python's ``surrogateescape``), or a JSON ``\\ud800`` escape decodes to."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (f"not valid Unicode text: a lone surrogate {text[exc.start]!r} at index "
                f"{exc.start} (bytes that are not UTF-8?)")
    return None


_DEEP = 200
"""Values nested this deep are round-tripped through JSON (``odd``): the serializer has a
depth limit of its own (about 256 levels), which an append must not be the first to meet."""


def _clean_json(value: Any, room: int = _DEEP) -> bool:
    """Whether a JSON-like value is plain JSON (no NaN or infinity either) that surely holds no
    lone surrogate: one pass in C (``json.dumps`` keeps surrogates as they are with
    ``ensure_ascii=False``) instead of a walk in Python."""
    try:
        text = json.dumps(value, ensure_ascii=False, check_circular=False, allow_nan=False)
    except (TypeError, ValueError):
        return False  # not plain JSON: walk it
    if not text.isascii() and text_problem(text) is not None:
        return False
    if text.count("[") + text.count("{") > room:  # it may nest too deep where it is: walk it
        return False
    # json.dumps writes a key 1, None or 1.5 as text: read back, it is another key (and
    # {1: "a", "1": "b"} loses one). Only reading it back tells.
    return "{" not in text or bool(json.loads(text) == value)


def wire_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a wire name, or None. Shown in every log line and matched
    exactly by readers: printable, without whitespace (a newline would forge a line of
    ``terret log``), 1 to 200 characters."""
    if not 1 <= len(name) <= 200:
        return "1 to 200 characters"
    if not name.isprintable() or any(c.isspace() for c in name):
        return "printable characters without whitespace"
    return None


_CLASS_SETTINGS = frozenset({"wire_name", "version", "model_visible", "commutative"})

MAX_VERSION = 2**31 - 1
"""The highest schema version: every store keeps it in a 32-bit field or less."""

_JSON_KINDS = (str, int, dict, list, tuple, BaseModel, type(None))  # bool is an int


INT_DIGITS = sys.int_info.default_max_str_digits
"""The most digits an integer in a payload may have: Python reads no longer one from JSON
(``sys.set_int_max_str_digits``, 4300 unless a process changed it), so every reader of the
record, in any process, could not read it back."""
_INT_BOUND = 10**INT_DIGITS


def _unstorable(value: Any, loc: str, odd: list[str], depth: int = 0, untyped: bool = False
                ) -> tuple[str, str] | None:
    """The location and problem of the first text or integer in ``value`` that cannot be
    stored. Inside a dict or list, a value JSON has no form for (bytes, a set, NaN, any other
    object), or one nested :data:`_DEEP` levels down, has its location added to ``odd``: a typed
    field may turn it into JSON and back (a datetime), or may not (``Any``), which only a round
    trip tells. ``untyped``: ``value`` sits where a field's type says ``Any`` — a model given
    there is kept as the object, and would read back as a dict: ``odd`` too."""
    if isinstance(value, str | int):
        problem = _scalar_problem(value)
        return (loc or "<payload>", problem) if problem else None
    items = _to_walk(value, depth)
    if items is None:
        return None
    keyed = isinstance(value, dict)  # a model's keys are its field names
    # In a model only an untyped field holds what it is given: a typed one (a datetime, a
    # UUID) has its own JSON form, which pydantic reads back.
    loose: frozenset[str] | None = None
    anywhere: frozenset[str] | None = None
    if isinstance(value, BaseModel):
        loose, anywhere = _loose_fields(type(value)), _untyped_fields(type(value))
    for key, item in items:
        here = f"{loc}.{key}" if loc else str(key)
        if keyed and isinstance(key, str) and (problem := text_problem(key)):
            return here.encode("ascii", "backslashreplace").decode(), f"key: {problem}"
        inner = untyped if anywhere is None else key in anywhere
        if not odd and ((keyed and not isinstance(key, str)) or depth >= _DEEP or (
                (loose is None or key in loose) and not _plain(item))
                or (inner and isinstance(item, BaseModel))):
            odd.append(here)
        if loose is None:
            found = _unstorable(item, here, odd, depth + 1, inner)
        else:  # a field of a model: one that contains itself is named
            try:
                found = _unstorable(item, here, odd, depth + 1, inner)
            except RecursionError:
                return here, "nested too deeply, or contains itself"
        if found is not None:
            return found
    return None


def _scalar_problem(value: str | int) -> str | None:
    if isinstance(value, str):
        return text_problem(value)
    if -_INT_BOUND < value < _INT_BOUND:
        return None
    return f"an integer of more than {INT_DIGITS} digits: no reader could read it back from JSON"


@cache
def _loose_fields(cls: type[BaseModel]) -> frozenset[str]:
    """The fields of ``cls`` typed ``Any`` (or ``object``): pydantic keeps whatever they are
    given, JSON or not."""
    return frozenset(name for name, info in cls.model_fields.items()
                     if info.annotation in (Any, object))


@cache
def _untyped_fields(cls: type[BaseModel]) -> frozenset[str]:
    """The fields of ``cls`` whose type says ``Any`` (or ``object``) anywhere in it — ``Any``,
    ``dict[str, Any]``, ``list[object] | None``: what sits there is kept as it was given."""
    return frozenset(name for name, info in cls.model_fields.items()
                     if _holds_any(info.annotation))


def _holds_any(annotation: Any) -> bool:
    if annotation is Any or annotation is object:
        return True
    return any(_holds_any(arg) for arg in get_args(annotation))


def _to_walk(value: Any, depth: int = 0) -> Iterable[tuple[Any, Any]] | None:
    """What ``_unstorable`` walks in ``value``: a model's fields, a container's items unless
    it is plain JSON without a lone surrogate (the usual case, checked in C), or None."""
    if isinstance(value, BaseModel):
        return value.__dict__.items()  # the fields' values (extra fields are forbidden)
    if isinstance(value, dict):
        return None if not value or _clean_json(value, _DEEP - depth) else value.items()
    if isinstance(value, list | tuple):
        if not value or (not isinstance(value[0], BaseModel)
                         and _clean_json(value, _DEEP - depth)):
            return None
        return enumerate(value)
    return None


def _plain(value: Any) -> bool:
    """Whether JSON has a form for ``value`` itself (containers are walked on their own)."""
    if isinstance(value, float):
        return value == value and value not in (float("inf"), float("-inf"))
    return isinstance(value, _JSON_KINDS)


def _same(read: Any, written: Any) -> bool:
    """Whether ``read`` is ``written`` as JSON gives it back (a tuple comes back a list)."""
    if isinstance(written, BaseModel):
        return type(read) is type(written) and all(
            _same(read.__dict__.get(k), v) for k, v in written.__dict__.items())
    if isinstance(written, dict):
        return isinstance(read, dict) and read.keys() == written.keys() and all(
            _same(read[k], v) for k, v in written.items())
    if isinstance(written, list | tuple):
        return isinstance(read, list | tuple) and len(read) == len(written) and all(
            map(_same, read, written))
    return type(read) is type(written) and bool(read == written)


def _survives_json(payload: BaseModel, name: str, loc: str) -> None:
    """Raise ``InvalidPayload`` unless ``payload`` reads back from its JSON as it is: what is
    written must be what every later reader gets (bytes, a set or NaN under ``Any`` would come
    back as text, a list or null; an object JSON has no form for could not be written)."""
    try:
        written = (payload.to_json() if isinstance(payload, EventPayload)
                   else payload.model_dump_json(exclude_none=True))
        back = type(payload).model_validate_json(written)
    except (PydanticSerializationError, ValidationError) as exc:
        raise InvalidPayload(name, loc, "JSON has no form for this value "
                             f"({' '.join(str(exc).split())[:120]})") from None
    if not _same(back, payload):
        raise InvalidPayload(name, loc, "would not read back as written: JSON has no form for "
                             "bytes, sets, NaN, infinity, keys other than text or other "
                             "objects, and a model where the type says Any reads back as a "
                             "dict")


def check_storable(value: BaseModel, name: str) -> None:
    """``InvalidPayload`` naming the first field of ``value`` (a validated payload, or a part
    of one) that would not be stored and read back as it is: text that cannot be encoded, an
    integer no reader can parse, a value JSON has no form for, one nested too deeply."""
    odd: list[str] = []
    try:
        found = _unstorable(value, "", odd)
        if found is None and odd:
            _survives_json(value, name, odd[0])
    except RecursionError:  # a value that contains itself, or nested thousands deep
        raise InvalidPayload(name, odd[0] if odd else "<payload>",
                             "nested too deeply, or contains itself") from None
    if found is not None:
        raise InvalidPayload(name, *found)


class EventPayload(BaseModel):
    """Base of every event payload.

    Subclasses set ``wire_name`` (stable, e.g. ``"turn/start"``), ``version`` (the schema version
    the class writes) and ``model_visible`` (whether the messages projection shows it to the model).
    ``commutative`` marks events another process may append while a turn runs without taking the
    session from its writer (R5). Creating a payload validates it and raises :class:`InvalidPayload`
    naming the first offending field, also for text that cannot be stored (a lone surrogate, in
    any string of the payload, nested ones included).
    """

    # Terret's own payload classes build their validators when first used (a command that
    # reads five kinds of event does not pay for thirty at start-up); an extension registered
    # later is built at once, so a mistake in its definition shows where it is made.
    # NaN and inf have no JSON form (they would be stored as null, and the record not read
    # back): refused as every bad field is, when the payload is made.
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True, allow_inf_nan=False)

    wire_name: ClassVar[str] = ""
    version: ClassVar[int] = 1
    model_visible: ClassVar[bool] = False
    commutative: ClassVar[bool] = False

    def __init__(self, **data: Any) -> None:
        name = type(self).wire_name or type(self).__name__
        validated(self, name, data)  # what BaseModel.__init__ does, for a payload being made
        check_storable(self, name)

    # Only construction in code needs the typed error. Marked as pydantic's own ``__init__``,
    # it is not called again by ``model_validate``/``model_validate_json`` (decoding), which
    # would otherwise validate every stored payload twice.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    def to_json(self) -> bytes:
        """The payload's JSON; ``InvalidPayload`` for a field that does not hold its type — a
        payload made without validation (``model_construct``) — which would be written and
        then not read back (pydantic only warns)."""
        try:
            return self.model_dump_json(exclude_none=True, warnings="error").encode()
        except PydanticSerializationError as exc:
            if "UnexpectedValue" not in str(exc):
                raise  # no JSON form at all (too deep): what creation refuses, field named
            name = type(self).wire_name or type(self).__name__
            found = re.search(r"field_name='([^']*)'", str(exc))
            raise InvalidPayload(name, found.group(1) if found else "?",
                                 "does not hold its type (a payload made without validation, "
                                 "model_construct?): " + " ".join(str(exc).split())[:160]
                                 ) from None


@dataclass(frozen=True)
class OpaquePayload:
    """An event this process cannot read: a wire name it does not know (written by a newer
    version or by an extension not installed here), or a known wire name at a newer schema
    version than the registered class. It keeps its data so nothing is lost, and is never
    processed by Terret's projections."""

    wire_name: str
    version: int
    data: dict[str, Any] = field(default_factory=dict)

    model_visible: ClassVar[bool] = False
    commutative: ClassVar[bool] = False

    def to_json(self) -> bytes:
        return json.dumps(self.data).encode()


Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


def _same_function(registered: Upcaster, new: Upcaster) -> bool:
    """The same upcaster, imported again (a module reloaded, imported under two names): same
    module and name, and the same code at the same line. Two functions of one name in a module,
    or two lambdas, are different ones."""
    if registered is new:
        return True
    def key(fn: Upcaster) -> tuple[object, ...]:
        return (getattr(fn, "__module__", None), getattr(fn, "__qualname__", None),
                getattr(fn, "__code__", None))
    return key(registered) == key(new) and key(new)[2] is not None
P = TypeVar("P", bound=type[EventPayload])


def _checked_class(cls: type[EventPayload]) -> str:
    """The class's wire name, once its settings are checked (``ConfigurationError``)."""
    if not (isinstance(cls, type) and issubclass(cls, EventPayload)):
        raise ConfigurationError(f"{cls!r} is not an event payload class: subclass "
                                 "terret.EventPayload")
    shadowing = sorted(set(cls.__pydantic_fields__) & _CLASS_SETTINGS)
    if shadowing:
        raise ConfigurationError(
            f"{cls.__name__}: a payload field may not be named {shadowing[0]!r}: it is "
            "the event class's own setting (the field would replace it when the event is "
            "written)")
    name = cls.wire_name
    if not name or not isinstance(name, str):
        raise ConfigurationError(f"{cls.__name__} has no wire_name: give it one as a "
                                 "ClassVar[str] (e.g. 'acme.bookmark/saved'), not "
                                 f"{name!r}")
    problem = wire_name_problem(name)
    if problem is not None:
        raise ConfigurationError(f"{cls.__name__}: wire_name {name[:200]!r} is not a wire "
                                 f"name: {problem} (e.g. 'acme.bookmark/saved')")
    version = cls.__dict__.get("version", cls.version)
    if type(version) is not int or not 1 <= version <= MAX_VERSION:
        raise ConfigurationError(f"{cls.__name__}: version is a whole number from 1 to "
                                 f"{MAX_VERSION}, not {version!r}")
    require_flags(cls.__name__, cls, "model_visible", "commutative")
    return name


class EventCatalogue:
    """Maps wire names to payload models and upgrades old schema versions on read."""

    def __init__(self) -> None:
        self._types: dict[str, type[EventPayload]] = {}
        self._upcasters: dict[tuple[str, int], Upcaster] = {}
        self._builtin: set[str] = set()

    def register(self, cls: P) -> P:
        """Register a payload class (usable as a class decorator)."""
        name = _checked_class(cls)
        existing = self._types.get(name)
        if existing is not None and existing is not cls:
            if existing.__qualname__ != cls.__qualname__ or existing.__module__ != cls.__module__:
                raise DuplicateEventType(
                    f"wire name {name!r} is already registered to {existing.__qualname__}"
                )
        stale = sorted(v for (n, v) in self._upcasters if n == name and v >= cls.version)
        if stale:  # registered before the class: the check the upcaster makes, made here
            raise ConfigurationError(
                f"{cls.__qualname__} ({name!r}) is at version {cls.version}, and an upcaster "
                f"from version {stale[0]} is registered for it: it would never run (an "
                "upcaster turns version N data into N + 1: bump the class's version)")
        self._types[name] = cls
        if self._builtin:  # Terret's own are registered: this is an extension
            cls.model_rebuild()
        return cls

    def mark_builtin(self) -> None:
        self._builtin = set(self._types)

    def unregister(self, wire_name: str) -> None:
        """Remove an extension type (tests use this to simulate a process that lacks it)."""
        self._types.pop(wire_name, None)
        for key in [k for k in self._upcasters if k[0] == wire_name]:
            del self._upcasters[key]

    def upcaster(self, wire_name: str, from_version: int) -> Callable[[Upcaster], Upcaster]:
        """Register a function turning ``from_version`` data into ``from_version + 1`` data."""

        if type(from_version) is not int or not 1 <= from_version < MAX_VERSION:
            raise ConfigurationError(
                f"upcaster for {wire_name!r}: from_version is a whole number from 1 to "
                f"{MAX_VERSION - 1}, not {from_version!r}")
        if wire_name in self._builtin:
            raise DuplicateEventType(
                f"{wire_name!r} is Terret's own event: its upcasters cannot be replaced")

        def decorate(fn: Upcaster) -> Upcaster:
            if not callable(fn):
                raise ConfigurationError(f"upcaster for {wire_name!r} from version "
                                         f"{from_version}: {fn!r} is not a function")
            cls = self._types.get(wire_name)
            if cls is not None and from_version >= cls.version:
                raise ConfigurationError(
                    f"upcaster for {wire_name!r} from version {from_version}: the class "
                    f"{cls.__qualname__} is at version {cls.version}, so it would never run "
                    "(an upcaster turns version N data into N + 1: bump the class's version)")
            existing = self._upcasters.get((wire_name, from_version))
            if existing is not None and not _same_function(existing, fn):
                raise DuplicateEventType(
                    f"{wire_name!r} has an upcaster from version {from_version} already "
                    f"({existing.__module__}.{existing.__qualname__}): one per step")
            self._upcasters[(wire_name, from_version)] = fn
            return fn

        return decorate

    def payload_class(self, wire_name: str) -> type[EventPayload] | None:
        return self._types.get(wire_name)

    def __contains__(self, wire_name: object) -> bool:
        return wire_name in self._types

    def __iter__(self) -> Iterator[type[EventPayload]]:
        return iter(sorted(self._types.values(), key=lambda c: c.wire_name))

    def wire_names(self) -> frozenset[str]:
        return frozenset(self._types)

    def is_builtin(self, wire_name: str) -> bool:
        return wire_name in self._builtin

    def decode(
        self, wire_name: str, version: int, data: dict[str, Any]
    ) -> EventPayload | OpaquePayload:
        """Decode stored data into its payload, upcasting old versions.

        An unknown wire name gives an :class:`OpaquePayload`, and so does a known one at a
        schema version above the registered class's (written by a newer release: its shape and
        meaning may have changed, so it is kept as written, not guessed at). Data that fails
        validation raises :class:`InvalidPayload` (the store turns it into a ``CorruptRecord``
        naming the position).
        """
        cls = self._types.get(wire_name)
        if cls is None or version > cls.version:
            return OpaquePayload(wire_name, version, data)
        while version < cls.version:
            step = self._upcasters.get((wire_name, version))
            if step is None:
                raise InvalidPayload(
                    wire_name, "<version>", f"no upcaster from version {version}"
                )
            data = _upcast(step, wire_name, version, data)
            version += 1
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            loc, msg = _first_error(exc)
            raise InvalidPayload(wire_name, loc, msg) from None
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - a validator's bug on stored
            # data (its sys.exit too: it would stop every reader of the log): unreadable
            raise InvalidPayload(wire_name, "<validator>", _failure(exc)) from exc


def _upcast(step: Upcaster, wire_name: str, version: int,
            data: dict[str, Any]) -> dict[str, Any]:
    """One upcaster step. An upcaster is application code run on whatever a store holds: one
    that raises (a field an old record lacks) or returns something other than an object makes
    that record unreadable (``InvalidPayload``, a ``CorruptRecord`` naming its position), not
    an unnamed error that stops every reader of the log."""
    try:
        upcast = step(dict(data))
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - reported, with the record's
        # position, by decode (a sys.exit in one stopped every reader of the log: serve, rebuild)
        raise InvalidPayload(wire_name, "<upcaster>",
                             f"the upcaster from version {version} failed: {_failure(exc)}"
                             ) from exc
    if not isinstance(upcast, dict):
        raise InvalidPayload(wire_name, "<upcaster>",
                             f"the upcaster from version {version} returned "
                             f"{type(upcast).__name__}, not a dict")
    return upcast


def _failure(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


catalogue = EventCatalogue()
"""The process-wide catalogue. Terret's events are registered in it when
``terret.domain.catalogue`` is first imported."""


def event_type(cls: P) -> P:
    """Class decorator: register a payload class in the process-wide catalogue."""
    return catalogue.register(cls)


def upcaster(wire_name: str, from_version: int) -> Callable[[Upcaster], Upcaster]:
    """Decorator: register an upcaster in the process-wide catalogue."""
    return catalogue.upcaster(wire_name, from_version)

