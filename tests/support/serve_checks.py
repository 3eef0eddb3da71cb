"""The check list the serve client scripts share (serve_api_client.py, serve_tools_client.py): every
check prints one line; the last line is 'N passed, N failed' (tests/app/serve_process.rs reads it)
and the exit status is 0 only when nothing failed.
"""

import sys

PASSED = []
FAILED = []


def check(name, cond, detail=""):
    if cond:
        PASSED.append(name)
        print(f"ok   {name}")
    else:
        FAILED.append(name)
        print(f"FAIL {name}: {detail}")


def run_checks(checks):
    """Runs `checks()`, then prints the summary line and exits with the status."""
    try:
        checks()
    except Exception as e:  # an unexpected failure is one failed check, reported with its cause
        check("no unexpected exception", False, f"{type(e).__name__}: {e}")
    print(f"{len(PASSED)} passed, {len(FAILED)} failed")
    sys.exit(1 if FAILED else 0)
