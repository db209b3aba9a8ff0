"""Between payloads and stored records: JSON data, JSON metadata with the schema version and
correlation/causation ids."""

from __future__ import annotations

import json
from typing import Any, NamedTuple
from uuid import UUID, uuid4

from terret.domain.catalogue import EventCatalogue, EventPayload, OpaquePayload, catalogue
from terret.domain.errors import CorruptRecord, InvalidPayload, UnknownEventType
from terret.domain.store import NewRecord, StoredRecord, session_id_of

AnyPayload = EventPayload | OpaquePayload


class RecordedEvent(NamedTuple):
    """A decoded event as readers see it. Immutable; a named tuple because every reader and
    every rebuild makes one per event, and a tuple is the cheapest immutable record."""

    stream: str
    seq: int
    position: int
    event_id: UUID
    wire_name: str
    version: int
    payload: AnyPayload
    recorded_at: float
    correlation_id: str | None = None
    causation_id: str | None = None

    @property
    def session_id(self) -> UUID | None:
        return session_id_of(self.stream)

    @property
    def is_opaque(self) -> bool:
        return isinstance(self.payload, OpaquePayload)


def encode(
    payload: AnyPayload,
    *,
    event_id: UUID | None = None,
    correlation_id: str | None = None,
    causation_id: str | None = None,
    registry: EventCatalogue = catalogue,
) -> NewRecord:
    if isinstance(payload, EventPayload) and payload.wire_name not in registry:
        raise UnknownEventType(
            f"{type(payload).__name__} ({payload.wire_name!r}) is not registered; "
            "decorate it with @terret.event_type"
        )
    if correlation_id or causation_id:
        meta: dict[str, Any] = {"schema_version": payload.version}
        if correlation_id:
            meta["correlation_id"] = correlation_id
        if causation_id:
            meta["causation_id"] = causation_id
        metadata = json.dumps(meta, separators=(",", ":")).encode()
    else:  # the same bytes json.dumps gives, without its cost on the append path
        metadata = b'{"schema_version":%d}' % payload.version
    return NewRecord(
        event_id=event_id or uuid4(),
        wire_name=payload.wire_name,
        data=payload.to_json(),
        metadata=metadata,
    )


def decode(record: StoredRecord, registry: EventCatalogue = catalogue) -> RecordedEvent:
    """Decode a record. Unknown wire names become opaque events; old versions are upcast;
    undecodable data raises :class:`CorruptRecord` naming the position."""
    decoder = _decoders.get(id(registry))
    if decoder is None or decoder.registry is not registry:
        decoder = _decoders[id(registry)] = RecordDecoder(registry)
    return decoder(record)


def schema_version(meta: dict[str, Any]) -> int:
    """The schema version a record's metadata names (1 when it names none). Anything but a
    whole number — ``"2"``, ``1.5``, ``true``, ``null`` — is refused (``ValueError``), as a
    class's ``version`` is: guessing would run the wrong upcasters on the data."""
    version = meta.get("schema_version", 1)
    if type(version) is not int:
        raise ValueError(f"schema_version is not a whole number: {json.dumps(version)}")
    return version


class RecordDecoder:
    """Decodes records, with a cheap path for the common one: metadata seen before (parsed once
    and remembered) and data at its class's current version (parsed and validated by pydantic
    straight from JSON). Anything else — an unknown wire name, an old version to upcast, any
    failure — takes the general path, so opaque events, upcasts and errors are the same."""

    max_metadata = 1024

    def __init__(self, registry: EventCatalogue = catalogue) -> None:
        self.registry = registry
        self._class_of = registry.payload_class
        self._metadata: dict[bytes, tuple[int, Any, Any] | None] = {}

    def __call__(self, record: StoredRecord) -> RecordedEvent:
        try:
            meta = self._metadata[record.metadata]
        except KeyError:
            meta = self._remember(record.metadata)
        if meta is not None:
            version: int = meta[0]
            correlation_id: Any = meta[1]
            causation_id: Any = meta[2]
            cls = self._class_of(record.wire_name)
            if cls is not None and cls.version == version:
                try:  # what ``model_validate_json`` calls, without its Python wrapper
                    payload = cls.__pydantic_validator__.validate_json(record.data)
                except (Exception, SystemExit):  # noqa: BLE001 - the general path reports it
                    pass
                else:
                    return RecordedEvent(
                        record.stream, record.seq, record.position, record.event_id,
                        record.wire_name, version, payload, record.recorded_at,
                        correlation_id, causation_id)
        return self._general(record)

    def _remember(self, metadata: bytes) -> tuple[int, Any, Any] | None:
        try:
            meta = json.loads(metadata) if metadata else {}
            parsed = (schema_version(meta), meta.get("correlation_id"),
                      meta.get("causation_id")) if isinstance(meta, dict) else None
        except (ValueError, TypeError):
            parsed = None
        if len(self._metadata) >= self.max_metadata:
            self._metadata.clear()
        self._metadata[metadata] = parsed
        return parsed

    @staticmethod
    def unreadable(record: StoredRecord) -> RecordedEvent:
        """A record that does not decode (``CorruptRecord``) as an opaque event, with what
        can be parsed of it: for a reader that needs no more of an event than its place in the
        log (the session index counts it), never for one that reads its fields."""
        def parsed(raw: bytes) -> dict[str, Any]:
            try:
                value = json.loads(raw) if raw else {}
            except ValueError:
                return {}
            return value if isinstance(value, dict) else {}

        meta = parsed(record.metadata)
        version = meta.get("schema_version", 1)
        version = version if type(version) is int else 1
        return RecordedEvent(record.stream, record.seq, record.position, record.event_id,
                             record.wire_name, version,
                             OpaquePayload(record.wire_name, version, parsed(record.data)),
                             record.recorded_at, meta.get("correlation_id"),
                             meta.get("causation_id"))

    def _general(self, record: StoredRecord) -> RecordedEvent:
        try:
            meta = json.loads(record.metadata) if record.metadata else {}
            if not isinstance(meta, dict):
                raise ValueError("metadata is not a JSON object")
            data = json.loads(record.data)
            if not isinstance(data, dict):
                raise ValueError("data is not a JSON object")
            version = schema_version(meta)
            payload = self.registry.decode(record.wire_name, version, data)
        except (ValueError, TypeError, InvalidPayload) as exc:
            raise CorruptRecord(record.position, f"{record.wire_name}: {exc}") from None
        return RecordedEvent(
            stream=record.stream,
            seq=record.seq,
            position=record.position,
            event_id=record.event_id,
            wire_name=record.wire_name,
            version=version,
            payload=payload,
            recorded_at=record.recorded_at,
            correlation_id=meta.get("correlation_id"),
            causation_id=meta.get("causation_id"),
        )


_decoders: dict[int, RecordDecoder] = {}
