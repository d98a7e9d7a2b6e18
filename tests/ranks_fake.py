"""A stand-in for a stage's DDP rank, for the launcher's tests (``flows._cli.run_ranks``).

``python -m ranks_fake OUT MODE`` (``tests/`` on ``PYTHONPATH``): each rank writes ``OUT/rank-<RANK>.json``
(its environment, the signals it got) whenever that changes. ``MODE``: ``ok`` exits 0; ``fail`` exits 3
from rank 1 once the others wait for a signal; ``wait`` waits for a signal in every rank. A rank stops
after its first signal (rank 0 last), with 128 + that signal, as a training rank does after its checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

from flows._cli import stop_with_launcher


def _held(host: str, port: int) -> bool:
    """Whether another process holds ``host:port`` (the launcher's rendezvous store)."""
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return True
        return False


def main() -> int:
    out, mode = Path(sys.argv[1]), sys.argv[2]
    rank = int(os.environ["RANK"])
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")
    keys += ("TORCHELASTIC_USE_AGENT_STORE",)
    record: dict = {"env": {k: os.environ.get(k) for k in keys}, "signals": [], "pid": os.getpid()}
    record["port_held"] = _held(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))

    def save() -> None:
        tmp = out / f".rank-{rank}.json"
        tmp.write_text(json.dumps(record))
        os.replace(tmp, out / f"rank-{rank}.json")

    signal.signal(signal.SIGTERM, lambda signum, _frame: record["signals"].append(signum))
    signal.signal(signal.SIGINT, lambda signum, _frame: record["signals"].append(signum))
    stop_with_launcher()
    save()
    if mode == "ok":
        return 0
    if mode == "fail" and rank == 1:  # once the others are ready for a signal
        world = int(os.environ["WORLD_SIZE"])
        while not all((out / f"rank-{r}.json").exists() for r in range(world)):
            time.sleep(0.02)
        return 3
    deadline = time.monotonic() + 60
    while not record["signals"] and time.monotonic() < deadline:
        time.sleep(0.02)
    save()
    time.sleep(1.0 if rank == 0 else 0.3)  # rank 0 last, as in a stage (tracking); a second signal shows here
    save()
    return 128 + record["signals"][0] if record["signals"] else 1


if __name__ == "__main__":
    sys.exit(main())
