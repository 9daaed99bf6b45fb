"""The completion-tracking core, as the implementation this process uses."""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamrep import _impl

if TYPE_CHECKING:
    from streamrep._pure import tracker as _core_tracker
else:
    _core_tracker = _impl.load("tracker")

CompletionTracker = _core_tracker.CompletionTracker
WriterPositions = _core_tracker.WriterPositions

__all__ = ["CompletionTracker", "WriterPositions"]
