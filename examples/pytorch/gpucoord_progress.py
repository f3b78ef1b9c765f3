"""Tell a gpucoord agent how a rank is doing: the progress protocol.

A rank started by gpucoord finds a Unix socket's path in GPUCOORD_PROGRESS
and may write one-line messages to it:

    step N [key=value ...]   finished step N (loss=, seconds= are shown)
    checkpoint N             wrote all of this rank's files of step N under
                             GPUCOORD_CHECKPOINT_DIR/N
    heartbeat                alive and busy in a long step

With it gpucoord shows the job's steps, commits a step once every rank has
written it (and its copies are in place), resumes a restarted job after the
committed step (GPUCOORD_RESUME_STEP) and notices a rank that stops making
progress. Outside gpucoord (no GPUCOORD_PROGRESS) every call does nothing.
"""

import os
import socket


class Progress:
    def __init__(self):
        self._sock = None
        path = os.environ.get("GPUCOORD_PROGRESS")
        if path:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._sock.connect(path)

    def _line(self, text):
        if self._sock is not None:
            self._sock.sendall((text + "\n").encode())

    def step(self, n, **values):
        """Say this rank finished step n (counted from 1)."""
        self._line(" ".join([f"step {int(n)}"] + [f"{k}={float(v)!r}" for k, v in values.items()]))

    def checkpoint(self, n):
        """Say this rank's files of step n are written under checkpoint_dir(n)."""
        self._line(f"checkpoint {int(n)}")

    def heartbeat(self):
        self._line("heartbeat")

    def close(self):
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def checkpoint_dir(step):
    """The directory this rank writes step's checkpoint files under."""
    return os.path.join(os.environ.get("GPUCOORD_CHECKPOINT_DIR", "checkpoints"), str(int(step)))


def resume_step():
    """The committed step a restarted job resumes after (0: from the start)."""
    return int(os.environ.get("GPUCOORD_RESUME_STEP", "0"))
