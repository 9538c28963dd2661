"""What every pytest run of the environment loads: the plugins' light entry.

Each module here imports nothing heavy (see [Note: the plugins' cost] in
:mod:`harness.entry.inplay`): whether a run uses shardcheck (:mod:`~harness.entry.inplay`), the
option names and defaults (:mod:`~harness.entry.defaults`), lazy exports
(:mod:`~harness.entry.lazy`) and SIGTERM handling (:mod:`~harness.entry.sigterm`).
"""
