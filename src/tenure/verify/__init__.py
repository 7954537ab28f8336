"""tenure verify: fault-injection scenarios, history recorder, checker, report.

The verifier is used through the ``tenure verify`` command (see the README and
docs/safety.md). Its modules are that command's implementation, not a Python API: this
package exports nothing, and their names may change without notice.
"""

__all__: list[str] = []
