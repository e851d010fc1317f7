"""Scale-out on Ray: one node agent per host, a driver with the single-host engine's API.

A reader's map: ``placement.py`` (pure: where a group goes, the ledger of every sample), ``agent.py`` (the Ray actor
owning a host's ``RolloutEngine``), ``guardian.py`` (the process that removes an agent's run if the agent dies),
``driver.py`` (``ClusterEngine``: placement, streaming, retries), ``local.py`` (a cluster of simulated nodes on
this machine, for ``--ray local:N``, tests and ``bunshin bench scale``). docs/cluster.md has the design.

This ``__init__`` imports nothing heavy: Ray is imported where it is used, so ``bunshin`` runs without it.
"""
