"""Helpers shared by streamrep's tests (importable as ``support``)."""
