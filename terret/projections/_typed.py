"""Typed handlers: one method per payload class, chosen by the class of the event's payload.

A projection marks a method with ``@handler``; the annotation of its last parameter names the
payload class (or a union of classes) it handles — ``def _ended(self, db, event, p: TurnEnded)``
— so mypy checks each handler against its class, and the class's ``wire_name`` is what the
projection handles. It is ``functools.singledispatchmethod``'s rule (the model: the
``eventsourcing`` library's ``Projection.process_event``), with two differences that matter on
a rebuild's path: the annotations are read when the projection first dispatches, not when its
module is imported (projection modules import the payload classes for typing only, so
importing one does not load them), and dispatching is one dictionary lookup by the payload's
class rather than singledispatch's per-call method binding and weak-reference cache.
"""

from __future__ import annotations

import inspect
import threading
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., None])

Handler = Callable[..., None]
"""``(projection, db, event, payload) -> None``."""

_MARK = "__terret_handler__"


def handler(fn: F) -> F:
    """Register a projection method as the handler of the payload class its last parameter is
    annotated with (``p: TurnStarted``; a union registers it for each class)."""
    setattr(fn, _MARK, True)
    return fn


def marked(namespace: Mapping[str, Any]) -> list[Handler]:
    """The handlers a class body defines."""
    return [fn for fn in namespace.values() if getattr(fn, _MARK, False)]


def payload_classes(fn: Handler) -> tuple[type[Any], ...]:
    """The classes named by the annotation of ``fn``'s last parameter. A name the module
    imports for typing only is looked up among Terret's payload classes (``OpaquePayload``,
    an event this process cannot read, included)."""
    annotation = list(inspect.signature(fn).parameters.values())[-1].annotation
    if isinstance(annotation, str):
        from terret.domain import events, payloads  # the payload classes: on first use

        try:  # the annotation as written in the handler's module (postponed evaluation)
            annotation = eval(annotation, {**vars(payloads), **vars(events), **fn.__globals__})
        except NameError as exc:
            raise TypeError(f"{fn.__qualname__}: {exc}; import the payload class at run time"
                            " (not under TYPE_CHECKING) unless it is one of Terret's") from None
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return typing.get_args(annotation)
    if not isinstance(annotation, type):
        raise TypeError(f"{fn.__qualname__}: its payload parameter names no class")
    return (annotation,)


class Dispatch:
    """A projection class's handlers by payload class, resolved on first use. ``layers``: the
    handlers of each class of the projection's MRO that defines some, its bases first (a
    subclass's handler for a class replaces its base's). A payload class without a handler of
    its own takes the one of its nearest base class that has one (as singledispatch does);
    None when no class in its MRO has one."""

    def __init__(self, layers: Iterable[Iterable[Handler]]) -> None:
        self._layers = [list(layer) for layer in layers]
        self._registered: dict[type[Any], Handler] | None = None
        self.by_class: dict[type[Any], Handler | None] = {}
        self._lock = threading.Lock()

    def registered(self) -> dict[type[Any], Handler]:
        found = self._registered
        if found is None:
            with self._lock:
                found = {}
                for layer in self._layers:
                    found.update(_one_layer(layer))
                self._registered = found
        return found

    def resolve(self, cls: type[Any]) -> Handler | None:
        registered = self.registered()
        fn = next((registered[c] for c in cls.__mro__ if c in registered), None)
        self.by_class[cls] = fn
        return fn

    def named_classes(self) -> list[type[Any]]:
        """The registered classes that have a wire name (a handler for a base class, such as
        one for every payload, needs the projection to say what it handles)."""
        return [cls for cls in self.registered() if getattr(cls, "wire_name", "")]


def _one_layer(handlers: list[Handler]) -> dict[type[Any], Handler]:
    found: dict[type[Any], Handler] = {}
    for fn in handlers:
        for cls in payload_classes(fn):
            if cls in found:
                raise TypeError(f"two handlers for {cls.__name__}: "
                                f"{found[cls].__qualname__}, {fn.__qualname__}")
            found[cls] = fn
    return found
