"""End-to-end runs of the verifier (``tenure verify``): real nodes, real faults.

This directory holds the runs that inject faults into whole systems and judge the
history they leave, as opposed to ``tests/integration``, which checks one behaviour of
the library at a time. Each scenario runs here with one cycle per configuration, in the
default suite, so CI covers every fault and every control; the full ``tenure verify
--quick`` (three cycles each, about two minutes) is marked ``slow`` and runs with
``pytest --slow``. Longer runs (``tenure verify``, ``--soak``) are for the command line.
"""
