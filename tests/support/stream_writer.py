"""A writer process for the multi-writer and crash tests (run as a script).

``python stream_writer.py URL INSTANCE WRITERS MODE [COUNT SEED]``

* ``MODE=work``: 3 greenlets write COUNT cache invalidations each to the ``caches``
  stream, with random delays, and roll back about one in five; prints one JSON line
  ``{"committed": [...], "rolled_back": [...], "visible": [...], "position": N}``.
* ``MODE=hang``: commits one fact, then reserves an ID, inserts its row and waits
  inside the open transaction after printing ``{"committed": [...], "hanging": ID}``.
"""

from __future__ import annotations

import json
import random
import sys
import time

import gevent

from streamrep.db import Database
from streamrep.streams import Streams


class Rollback(Exception):
    pass


def main() -> None:
    url, instance, writers_csv, mode = sys.argv[1:5]
    writers = writers_csv.split(",")
    db = Database.open(url)
    streams = Streams(db, instance, {"caches": writers})
    gen = streams.generator("caches")
    visible: list[int] = []
    gen.add_listener(lambda stream, inst, tokens, pos: visible.extend(tokens))
    committed: list[int] = []
    rolled_back: list[int] = []

    def write_one(rng: random.Random, fail: bool) -> None:
        with gen.get_next() as stream_id:
            try:
                with db.transaction("test_write") as txn:
                    gevent.sleep(rng.random() * 0.01)
                    txn.execute(
                        "INSERT INTO cache_invalidations (stream_id, instance_name, cache_name,"
                        " keys_json, invalidation_ts) VALUES (?, ?, ?, ?, ?)",
                        (stream_id, instance, "c", json.dumps([instance]), 0),
                    )
                    gevent.sleep(rng.random() * 0.01)
                    if fail:
                        raise Rollback()
            except Rollback:
                rolled_back.append(stream_id)
            else:
                committed.append(stream_id)

    if mode == "work":
        count, seed = int(sys.argv[5]), int(sys.argv[6])

        def worker(k: int) -> None:
            rng = random.Random(seed * 100 + k)
            for _ in range(count):
                write_one(rng, rng.random() < 0.2)

        gevent.joinall([gevent.spawn(worker, k) for k in range(3)], raise_error=True)
        streams.close()
        print(json.dumps({"committed": committed, "rolled_back": rolled_back,
                          "visible": visible, "position": gen.get_current_token_for_writer(instance)}),
              flush=True)
    elif mode == "hang":
        write_one(random.Random(0), False)
        streams.close()
        with gen.get_next() as stream_id:
            with db.transaction("hang") as txn:
                txn.execute(
                    "INSERT INTO cache_invalidations (stream_id, instance_name, cache_name,"
                    " keys_json, invalidation_ts) VALUES (?, ?, ?, ?, ?)",
                    (stream_id, instance, "c", None, 0),
                )
                print(json.dumps({"committed": committed, "hanging": stream_id}), flush=True)
                time.sleep(60)


if __name__ == "__main__":
    main()
