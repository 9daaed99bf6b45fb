"""streamrep's compiled core (Cython).

Sans-IO hot paths: line-command parsing and serialisation, stream-ID completion
tracking, DAG extremity updates, state delta application and the stream change
cache. Each module here has a pure-Python twin of the same API in
:mod:`streamrep._pure`; :mod:`streamrep._impl` chooses between them.
"""
