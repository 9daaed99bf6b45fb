"""The replication command set, declared once: names, argument shapes, senders.

Every other description of the commands follows this table:

* the pure-Python wire format (``streamrep._pure.wire``) and the compiled core
  (``src/_core/wire.pyx``) build their ``COMMANDS`` mapping with
  :func:`command_table`, which refuses a class set or field list that differs
  from the declaration;
* the replication protocol (``streamrep.replication.protocol``) refuses a
  command from a side that may not send it (:func:`accepted_from`);
* ``tests/test_wire_commands.py`` checks the compiled parser, the twin, the
  ``.pyi`` stub and ``docs/wire-protocol.md`` against it (names, arities,
  senders) and fails on any disagreement.

Adding a command: declare it in :data:`COMMAND_SET`, then run
``tests/test_wire_commands.py``, whose ``test_every_declared_command_has_every_piece``
lists each piece still missing, file by file: in ``src/_core/wire.pyx`` a
``CommandKind`` member, its match in ``_kind``, the class, a parse helper and its
branch in ``_parse``, and the ``COMMANDS`` entry; in ``streamrep/_pure/wire.py``
the class (``NAME``, ``FIELDS``, ``_parse``) in ``COMMANDS`` and ``__all__``; the
stub in ``src/_core/wire.pyi``; the re-export in ``streamrep/wire.py``; the row
in ``docs/wire-protocol.md``. A side that acts on the command adds an
``on_<NAME>`` handler in the protocol (see CONTRIBUTING.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, TypeVar

__all__ = [
    "SERVER_SIDE",
    "CLIENT_SIDE",
    "Argument",
    "CommandSpec",
    "COMMAND_SET",
    "SPECS",
    "accepted_from",
    "command_table",
]

#: The hub (the TCP server; on a Redis bus every process plays both sides).
SERVER_SIDE = "server"
#: A worker or writer process connected to the hub.
CLIENT_SIDE = "client"

_KINDS = frozenset({"word", "text", "int", "token", "json", "device", "sync_state", "stream_or_all",
                    "int_or_now"})


@dataclass(frozen=True)
class Argument:
    """One argument of a command line.

    ``kind`` is one of: ``word`` (non-empty, no space), ``text`` (the rest of the
    line, may be empty or hold spaces), ``int`` (64-bit decimal), ``token`` (an
    ``int`` or ``batch``), ``json`` (the rest of the line, one JSON value),
    ``device`` (a word or ``None``), ``sync_state`` (``start`` or ``end``),
    ``stream_or_all`` (a word or ``ALL``), ``int_or_now`` (an ``int`` or ``NOW``).
    """

    name: str
    kind: str

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"unknown argument kind {self.kind!r}")


@dataclass(frozen=True)
class CommandSpec:
    """One command: its wire name, accepted argument shapes, Python fields and senders.

    ``shapes`` lists every accepted argument list (most commands have one;
    ``REPLICATE`` has two). ``fields`` are the command class's constructor
    arguments (``FIELDS``). ``sent_by`` holds :data:`SERVER_SIDE` and/or
    :data:`CLIENT_SIDE`: who may send it on a TCP connection (the hub relays
    some client commands to the other clients, so those are sent by both).
    """

    name: str
    shapes: tuple[tuple[Argument, ...], ...]
    fields: tuple[str, ...]
    sent_by: frozenset[str]
    summary: str

    @property
    def arities(self) -> tuple[int, ...]:
        """The number of space-separated arguments of each shape (a ``text`` or
        ``json`` last argument counts as one)."""
        return tuple(len(shape) for shape in self.shapes)

    @property
    def rest_of_line(self) -> bool:
        """Whether the last argument takes the rest of the line (spaces included)."""
        return any(shape and shape[-1].kind in ("text", "json") for shape in self.shapes)


def _spec(name: str, shape: Iterable[tuple[str, str]], fields: Iterable[str] | None, sent_by: str,
          summary: str, *more_shapes: Iterable[tuple[str, str]]) -> CommandSpec:
    shapes = tuple(tuple(Argument(n, k) for n, k in s) for s in (shape, *more_shapes))
    sides = frozenset({"S": {SERVER_SIDE}, "C": {CLIENT_SIDE}, "SC": {SERVER_SIDE, CLIENT_SIDE}}[sent_by])
    field_names = tuple(fields) if fields is not None else tuple(a.name for a in shapes[0])
    return CommandSpec(name, shapes, field_names, sides, summary)


_TEXT = (("data", "text"),)

#: Every command, in the order the wire modules list them.
COMMAND_SET: tuple[CommandSpec, ...] = (
    _spec("SERVER", _TEXT, None, "S", "the hub's server name, first thing on a connection"),
    _spec("RDATA", (("stream_name", "word"), ("instance_name", "word"), ("token", "token"), ("row", "json")),
          None, "SC", "one stream row (from the hub, or from a writer to the hub)"),
    _spec("POSITION", (("stream_name", "word"), ("instance_name", "word"), ("prev_token", "int"),
                       ("new_token", "int")),
          None, "SC", "a writer's position moved (from the hub, or from a writer to the hub)"),
    _spec("ERROR", _TEXT, None, "SC", "an error; the sender usually closes"),
    _spec("PING", _TEXT, None, "SC", "keepalive"),
    _spec("NAME", _TEXT, None, "C", "the client's instance name"),
    _spec("REPLICATE", (), ("stream_name", "token"), "C",
          "ask for every position (or, legacy form, a stream's rows after a token)",
          (("stream_name", "stream_or_all"), ("token", "int_or_now"))),
    _spec("USER_SYNC", (("instance_id", "word"), ("user_id", "word"), ("device_id", "device"),
                        ("is_syncing", "sync_state"), ("last_sync_ms", "int")),
          None, "SC", "a user started or stopped syncing (relayed by the hub)"),
    _spec("CLEAR_USER_SYNC", (("instance_id", "text"),), None, "SC",
          "forget a worker's syncing users (relayed by the hub)"),
    _spec("FEDERATION_ACK", (("instance_name", "word"), ("token", "int")), None, "SC",
          "federation data received up to a token (relayed by the hub)"),
    _spec("USER_IP", (("user_id", "word"), ("payload", "json")),
          ("user_id", "access_token", "ip", "user_agent", "device_id", "last_seen"), "SC",
          "a user's client was seen (relayed by the hub)"),
    _spec("REMOTE_SERVER_UP", _TEXT, None, "SC", "a remote server may be back online"),
    _spec("LOCK_RELEASED", (("payload", "json"),), ("instance_name", "lock_name", "lock_key"), "SC",
          "a named lock was released"),
    _spec("NEW_ACTIVE_TASK", _TEXT, None, "SC", "a scheduled task became active"),
    _spec("CANCEL_TASK", _TEXT, None, "SC", "cancel a running scheduled task"),
    _spec("AUTH_CHALLENGE", (("nonce", "word"),), None, "S",
          "the hub's nonce for the shared-secret handshake, before NAME"),
    _spec("AUTH_RESPONSE", (("instance_name", "word"), ("nonce", "word"), ("proof", "word")),
          None, "C", "the instance a peer speaks for, its nonce and its proof of the secret"),
    _spec("AUTH_OK", (("proof", "word"),), None, "S",
          "the hub accepted the peer and proves it holds the secret too"),
)

#: Every command's declaration by wire name.
SPECS: Mapping[str, CommandSpec] = {spec.name: spec for spec in COMMAND_SET}


def accepted_from(side: str) -> frozenset[str]:
    """Names of the commands a peer playing *side* may send."""
    if side not in (SERVER_SIDE, CLIENT_SIDE):
        raise ValueError(f"unknown side {side!r}")
    return frozenset(spec.name for spec in COMMAND_SET if side in spec.sent_by)


_C = TypeVar("_C")


def command_table(classes: Iterable[_C]) -> dict[str, _C]:
    """The ``COMMANDS`` mapping of a wire implementation: its command classes by
    name, in declaration order.

    Raises :class:`TypeError` when the classes' names or ``FIELDS`` differ from
    :data:`COMMAND_SET`, so an implementation that drifted fails at import.
    """
    by_name: dict[str, _C] = {}
    for cls in classes:
        by_name[str(getattr(cls, "NAME"))] = cls
    missing = [spec.name for spec in COMMAND_SET if spec.name not in by_name]
    extra = sorted(set(by_name) - set(SPECS))
    if missing or extra:
        raise TypeError(f"wire command classes differ from the declared command set: "
                        f"missing {missing}, undeclared {extra}")
    for spec in COMMAND_SET:
        fields = tuple(getattr(by_name[spec.name], "FIELDS"))
        if fields != spec.fields:
            raise TypeError(f"{spec.name}: fields {fields} differ from the declared {spec.fields}")
    return {spec.name: by_name[spec.name] for spec in COMMAND_SET}
