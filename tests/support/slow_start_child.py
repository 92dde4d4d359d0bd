"""A child for harness/child_process.py's limits: sleeps ``argv[1]`` seconds, then reports done
(the event line written by hand: nothing imported that could take the time instead)."""

import sys
import time

if __name__ == "__main__":
    time.sleep(float(sys.argv[1]))
    sys.stdout.write('batchinv-child {"event": "done", "status": "ok"}\n')
    sys.stdout.flush()
