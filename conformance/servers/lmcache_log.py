"""What a server the suite supplied logged while it served: the first line LMCache logged at ERROR
or CRITICAL before its stop began, read from its log.

LMCache's own lines (``lmcache/logging.py``'s formatter, read on 0.32) are
``[2026-12-07 06:32:54,734] LMCache ERROR: message (file.py:123:logger.name)`` in ANSI colours; a
server that fails every store of its L2 adapter logs one such line (and its traceback) per store
while the engines' round trips still pass on its memory tier. Nothing else is read as an error:
uvicorn's own lines (``ERROR:    [Errno 98] ...``, a port taken before the bind, which the suite
retries on new ports) and the tracebacks between lines are not LMCache's.

Nor is a client's leaving: LMCache 0.5.6 may end a lookup session of a client whose context was
just unregistered (``lookup.end_session`` raising "No attention-window descriptor registered"), a
race of its own at each connector shutdown, which the suite's short-lived connector pairs meet far
more often than an engine does; the loads are judged byte for byte all the same (``_CLIENT_LEFT``).

A stop is not the server's serving: the suite stops it with SIGINT, uvicorn logs ``Shutting down``,
and what follows (LMCache's ``Shutting down LMCache HTTP server...``, the ``CancelledError`` and
``KeyboardInterrupt`` tracebacks uvicorn's loop leaves at every stop, whatever breaks as its
connections close) is not counted, until a start appends to the same log again (``Starting LMCache
HTTP server on``: a restart).
"""

from __future__ import annotations

import re
from pathlib import Path

_ANSI = re.compile(rb"\x1b\[[0-9;]*m")
_ERROR = re.compile(rb"^\[[^\]]*\] LMCache (?:ERROR|CRITICAL):")
_STOPPING = (b"INFO:     Shutting down", b"LMCache INFO: Shutting down LMCache HTTP server")
_STARTING = b"LMCache INFO: Starting LMCache HTTP server on "
_LINE = re.compile(rb"^\[[^\]]*\] LMCache ")  # any line of LMCache's: what follows an error line until it is its traceback
# A traceback that holds all of one of these is a client's leaving, not the server's serving.
_CLIENT_LEFT = ((b"in end_session", b"No attention-window descriptor registered"),)
SHOWN_CHARS = 600  # of the line named: LMCache's lines name a file path (an fs tier's: 200 characters)


class ServedLog:
    """One server's log, read as it grows: each ``first_error`` reads only what was appended since
    the last (a connector level's log grows by thousands of lines a clause), whole lines only."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._offset = self._lines = 0
        self._stopping = False
        self._error: str | None = None

    def first_error(self) -> str | None:
        """``"<log>, line N: <the line>"`` for the first ERROR or CRITICAL line LMCache logged in it
        while serving; None while there is none (or no log yet)."""
        if self._error is None:
            self._read()
        return self._error

    def _read(self) -> None:
        try:
            with open(self.path, "rb") as log:
                log.seek(self._offset)
                data = log.read()
        except OSError:  # not started yet, or never: nothing logged
            return
        whole = data[:data.rfind(b"\n") + 1]  # a line still being written is read next time
        self._offset += len(whole)
        lines = [_ANSI.sub(b"", raw).strip() for raw in whole.split(b"\n")[:-1]]
        for i, line in enumerate(lines):
            self._lines += 1
            if _STARTING in line:
                self._stopping = False
            elif any(mark in line for mark in _STOPPING):
                self._stopping = True
            elif not self._stopping and _ERROR.match(line) and not _client_left(lines[i + 1:]):
                shown = line.decode(errors="replace")
                shown = shown if len(shown) <= SHOWN_CHARS else shown[:SHOWN_CHARS] + " [...]"
                self._error = f"{self.path}, line {self._lines}: {shown}"
                return


def _client_left(after: list[bytes]) -> bool:
    """Whether the traceback after an error line (up to LMCache's next line; logged in the same write)
    is a client's leaving (``_CLIENT_LEFT``)."""
    traceback = b"\n".join(next((after[:n] for n, line in enumerate(after) if _LINE.match(line)), after))
    return any(all(mark in traceback for mark in marks) for marks in _CLIENT_LEFT)
