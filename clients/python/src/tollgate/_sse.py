"""An incremental ``text/event-stream`` parser for the run's live stream.

Bytes go in as they arrive (any split, CRLF or LF); whole items come out: ``retry:``
hints, frames (``id:`` / ``event:`` / ``data:``), and comments (``: keep-alive``), which
say the stream is alive. A frame a broken response leaves half-read is never handed out.
Memory is bounded: a line over :data:`MAX_LINE` bytes (complete or still arriving), or
a frame gathering more than :data:`MAX_FRAME_DATA` of data, stops the parser —
:attr:`SseParser.overflowed` turns true, what it holds is dropped and it takes nothing
more (the response is to be dropped as broken; a new one gets a new parser).
"""

from __future__ import annotations

from dataclasses import dataclass

#: The longest line of the stream (an event is at most 64 KiB of payload).
MAX_LINE = 1 << 20
#: The most ``data`` one frame may gather over several lines.
MAX_FRAME_DATA = 4 << 20


@dataclass(frozen=True)
class Frame:
    """One dispatched frame."""

    #: ``id:`` — the event's sequence (``None`` on ``done``).
    id: str | None
    #: ``event:`` — the event's type, or ``done``.
    event: str
    #: ``data:`` lines joined by ``\\n`` — the event's JSON.
    data: str

    def sequence(self) -> int | None:
        """The sequence in ``id:``, when it is one."""
        if self.id is None:
            return None
        text = self.id.strip()
        return int(text) if text.isascii() and text.isdigit() else None

    @property
    def done(self) -> bool:
        """Whether this is the final frame after the run's terminal event."""
        return self.event == "done" and self.id is None


@dataclass(frozen=True)
class Retry:
    """``retry: <ms>``: how soon to reconnect after the end of a window."""

    ms: int


@dataclass(frozen=True)
class Comment:
    """A comment line (``: keep-alive``)."""


Item = Frame | Retry | Comment


class SseParser:
    """The parser's state between chunks."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._event = ""
        self._data: list[str] = []
        self._data_len = 0
        self._id: str | None = None
        self.overflowed = False

    def feed(self, chunk: bytes) -> list[Item]:
        """Feeds the next bytes; the items they complete (those before an overflowing
        line still come out)."""
        out: list[Item] = []
        if self.overflowed:
            return out
        scan = len(self._buf)
        self._buf += chunk
        start = 0
        while True:
            end = self._buf.find(b"\n", scan)
            if end < 0:
                break
            line = bytes(self._buf[start:end])
            if line.endswith(b"\r"):
                line = line[:-1]
            if len(line) > MAX_LINE:
                return self._overflow(out)
            start = scan = end + 1
            self._line(line.decode("utf-8", errors="replace"), out)
            if self._data_len > MAX_FRAME_DATA:
                return self._overflow(out)
        del self._buf[:start]
        # The line in progress (one byte more for a `\r` before its `\n`).
        if len(self._buf) > MAX_LINE + 1:
            return self._overflow(out)
        return out

    def _overflow(self, out: list[Item]) -> list[Item]:
        self.overflowed = True
        self._buf = bytearray()
        self._data = []
        self._data_len = 0
        return out

    def _line(self, line: str, out: list[Item]) -> None:
        if not line:
            if self._data or self._event:
                data = "\n".join(self._data)
                out.append(Frame(self._id, self._event, data))
            self._event, self._data, self._data_len, self._id = "", [], 0, None
            return
        if line.startswith(":"):
            out.append(Comment())
            return
        field, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if field == "event":
            self._event = value
        elif field == "data":
            self._data.append(value)
            self._data_len += len(value) + 1
        elif field == "id" and "\0" not in value:
            self._id = value
        elif field == "retry" and value.isascii() and value.isdigit():
            out.append(Retry(int(value)))
