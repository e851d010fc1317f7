"""The workspace runtime: how a workspace is made of Linux primitives, run, forked and removed.

A reader's map (one idea per module):

- ``runtime.py``: a run (state directory, layer pool, parent cgroup, base image, nursery) and its first workspaces;
  ``hosts.py``: starting, watching and removing hosts (what workspaces and fork backends are given);
- ``host.py``: the host process inside a workspace; ``agents.py``: agent commands; ``workers.py``: worker
  processes; ``nursery.py``: the run's reaper process;
- ``fork/``: the live fork (engine side ``cow.py``, host side ``source.py`` and ``clone.py``, workers
  ``worker.py``), the private-restore baseline (``restore.py``, ``checkpoint.py``) and the backend interface;
- ``namespaces.py``, ``rootfs.py``, ``image.py``, ``layers.py``, ``cgroups.py``, ``syscalls.py``: one file per
  kind of kernel object; ``channel.py`` and ``protocol.py``: the wire;
- ``memory.py`` (PSS accounting), ``page_sharing.py`` (identical vs physically shared pages), ``doctor.py``
  (what this host supports), ``cleanup.py`` (runs whose engine died), ``checkpoint_file.py``, ``await_points.py``
  (where tests step in), ``heap_app.py`` (the fork benchmark's application).

Import ``WorkspaceRuntime`` from ``bunshin.envs``; this package's ``__init__`` imports nothing, so a workspace host
process loads only what it uses.
"""
