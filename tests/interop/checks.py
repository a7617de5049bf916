"""What both Python SDK clients (py_client.py for 1.x, py_client_v2.py for 2.x) report
with: one PASS/FAIL/SKIP line per check, the SDK's warnings kept for inspection, and a
closing 'N passed, N failed' with exit status 1 when anything failed."""

import logging
import sys

BUILTINS = ["edit_file", "find_files", "read_file", "run_command", "search_code", "write_file"]

RESULTS = {"passed": 0, "failed": 0}


class Warnings(logging.Handler):
    """Keeps what the SDK logs at WARNING and above (e.g. a failed session termination)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


WARNINGS = Warnings()
logging.getLogger().addHandler(WARNINGS)


def check(name, ok, detail=""):
    RESULTS["passed" if ok else "failed"] += 1
    print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail and not ok else ''}", flush=True)


def skip(name, why):
    print(f"SKIP {name}: {why}", flush=True)


def terminated_cleanly(label):
    """Leaving a Streamable HTTP client ends its session with a DELETE, which must
    have succeeded (the SDKs only log a failure)."""
    failed = [m for m in WARNINGS.messages if "termination" in m]
    check(f"{label} session terminated cleanly", not failed, str(failed))


def finish():
    print(f"{RESULTS['passed']} passed, {RESULTS['failed']} failed", flush=True)
    sys.exit(1 if RESULTS["failed"] else 0)
