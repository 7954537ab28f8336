"""tenure verify: fault-injection scenarios, history recorder, checker, report."""
