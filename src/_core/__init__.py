"""streamrep's compiled core (Cython).

Sans-IO hot paths: line-command parsing and serialisation, stream-ID completion
tracking, event validation, DAG extremity updates, state delta application, the
stream change cache, and the room rules' auth chains, state sets and plain-event
checks. Each module here has a pure-Python twin of the same API in
:mod:`streamrep._pure`; :mod:`streamrep._impl` chooses between them.
"""
