"""Profile ``batchinv sweep`` (cProfile), keeping the stats if a time cap interrupts it.

    python ci/profile_sweep.py OUT.prof [sweep arguments...]

Writes OUT.prof (pstats) and prints the top functions by cumulative and by own time.  Used to
find where the GPU sweep's time goes (compilation, launches, host syncs, references).
"""

from __future__ import annotations

import cProfile
import pstats
import signal
import sys


def main() -> int:
    out, args = sys.argv[1], sys.argv[2:]
    from batchinv.harness.cli import main as cli_main

    signal.signal(signal.SIGTERM, signal.default_int_handler)
    prof = cProfile.Profile()
    prof.enable()
    rc = 1
    try:
        rc = cli_main(["sweep", *args])
    except KeyboardInterrupt:
        print("interrupted: stats so far", file=sys.stderr)
    finally:
        prof.disable()
        prof.dump_stats(out)
        stats = pstats.Stats(prof, stream=sys.stderr)
        stats.sort_stats("cumulative").print_stats(45)
        stats.sort_stats("tottime").print_stats(25)
    return rc


if __name__ == "__main__":
    sys.exit(main())
