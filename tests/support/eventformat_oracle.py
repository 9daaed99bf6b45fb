"""Run by the reference implementation's interpreter, never imported by streamrep.

Reads ``[{"version": "10", "event": {...}}, ...]`` on stdin and prints, for each
case, what the reference makes of the event in a room of that version:
``{"pruned", "content_hash", "reference_hash", "event_id"}`` (``event_id`` null for
versions 1 and 2, whose IDs are not derived; hashes in unpadded Base64).

With the argument ``time N``, it instead prints the seconds the reference takes to
compute the reference hash and event ID of every event N times over, from events
it has built beforehand (untimed), as ``{"seconds": s, "events": n}``.

This file must only import the standard library and the reference (``synapse``).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from synapse.api.room_versions import KNOWN_ROOM_VERSIONS
from synapse.crypto.event_signing import compute_content_hash, compute_event_reference_hash
from synapse.events import make_event_from_dict
from synapse.synapse_rust.events import redact_event_dict
from unpaddedbase64 import encode_base64


def _answer(case: dict[str, Any]) -> dict[str, Any]:
    version = KNOWN_ROOM_VERSIONS[case["version"]]
    event = case["event"]
    _, content = compute_content_hash(dict(event), hash_algorithm=__import__("hashlib").sha256)
    built = make_event_from_dict(dict(event), version)
    _, reference = compute_event_reference_hash(built)
    derived = version.event_format != 1  # EventFormatVersions.ROOM_V1_V2
    return {
        "pruned": redact_event_dict(version, event),
        "content_hash": encode_base64(content),
        "reference_hash": encode_base64(reference),
        "event_id": built.event_id if derived else None,
    }


def _time(cases: list[dict[str, Any]], rounds: int) -> dict[str, Any]:
    built = [make_event_from_dict(dict(c["event"]), KNOWN_ROOM_VERSIONS[c["version"]])
             for c in cases]
    start = time.process_time()
    for _ in range(rounds):
        for event in built:
            _, digest = compute_event_reference_hash(event)
            "$" + encode_base64(digest, urlsafe=True)
    return {"seconds": time.process_time() - start, "events": len(built) * rounds}


def main() -> None:
    cases = json.load(sys.stdin)
    if len(sys.argv) > 2 and sys.argv[1] == "time":
        print(json.dumps(_time(cases, int(sys.argv[2]))))
        return
    print(json.dumps([_answer(case) for case in cases]))


if __name__ == "__main__":
    main()
