"""The workspace runtime: how a workspace is made of Linux primitives, run, forked and removed.

A reader's map (one idea per module):

- ``runtime.py``: a run (state directory, layer pool, parent cgroup, base image, nursery) and its first workspaces;
  ``hosts.py``: starting, watching and removing hosts, and the run's task scope (what workspaces and fork backends
  are given); ``host_workspace.py``: ``HostWorkspace``, the ``Workspace`` contract (``envs/workspace.py``) over a
  host's socket; ``image_files.py``: durable images and restores from them;
- ``host.py``: the host process inside a workspace; ``agents.py``: agent commands; ``workers.py``: worker
  processes; ``nursery.py``: the run's reaper process; ``task_scope.py``: owning scopes for background tasks;
- ``fork/``: the live fork (engine side ``cow.py``, host side ``source.py`` and ``clone.py`` on the host's
  ``ForkState`` of ``state.py``, workers ``worker.py``), the private-restore baseline (``restore.py``,
  ``checkpoint.py``), the backend interface (``backends.py``) and the registry of backends (``registry.py``);
- ``namespaces.py``, ``rootfs.py``, ``image.py``, ``layers.py``, ``cgroups.py``, ``syscalls.py``: one file per
  kind of kernel object; ``channel.py`` and ``protocol.py``: the wire;
- ``memory.py`` (PSS accounting), ``page_sharing.py`` (identical vs physically shared pages), ``doctor.py``
  (what this host supports), ``cleanup.py`` (runs whose engine died), ``checkpoint_file.py``, ``await_points.py``
  (where tests step in), ``heap_app.py`` (the fork benchmark's application).

Import ``WorkspaceRuntime`` from ``bunshin.envs``; this package's ``__init__`` imports nothing, so a workspace host
process loads only what it uses.
"""
