"""Interop with the reference implementation: its own parsers judge streamrep's lines.

The reference runs in its own venv (see tests/support/reference.py); these tests skip
without it, and fail under ``STREAMREP_REQUIRE_REFERENCE=1``.
"""

from __future__ import annotations

from support.reference import check_lines, reference_lines


def test_the_oracle_refuses_rows_the_reference_cannot_parse() -> None:
    report = check_lines([
        'RDATA to_device w 5 ["@u:hs","DEVICE"]',
        'RDATA caches w 6 ["get_user_by_id",null,"1700000000000"]',
        'RDATA nonsense w 7 []',
        'POSITION events w 1',
        'RDATA to_device w 8 ["@u:hs"]',
    ])
    assert report.checked == 5
    refused = {f["line"].split(" ")[1] + " " + f["line"].split(" ")[3] for f in report.failures}
    assert refused == {"to_device 5", "caches 6", "nonsense 7", "events 1"}


def test_the_reference_accepts_its_own_rows() -> None:
    lines = reference_lines()
    streams = {line.split(" ")[1] for line in lines}
    assert streams == {"events", "backfill", "caches", "account_data", "to_device",
                       "receipts", "typing"}
    assert check_lines(lines).failures == []
