"""``streamrep demo``: a whole deployment on one machine, checked end to end.

* :mod:`.workload`: the seeded room workload (pure);
* :mod:`.writer` and :mod:`.worker`: the writer and worker processes;
* :mod:`.runner`: starts the hub, writers and workers, shows progress, checks that
  every worker received every fact of the database exactly once;
* :mod:`.report`: the progress display and the summary tables.
"""
