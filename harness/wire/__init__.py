"""The wire format between the controller and its ranks.

- :mod:`~harness.wire.protocol`: the commands and events, pickled once.
- :mod:`~harness.wire.fnref`: rank functions named by module and qualified name.
- :mod:`~harness.wire.attach`: attach mode's store keys and the torchrun run's description.
"""
