"""An incremental Server-Sent Events parser (the WHATWG event-stream format), and its
sibling for a stream of one JSON object a line (NDJSON: Ollama's `/api/chat`).

Bytes go in as they arrive, in pieces of any size; complete events come out. It handles
events split across reads (even inside a UTF-8 character or a CRLF), `:` keep-alive
comments, multi-line `data:`, CR / LF / CRLF line ends, and a final event without its
blank line when the stream closes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched event."""

    data: str
    event: str = "message"
    id: str | None = None


class SSEParser:
    """Feed bytes with `feed()`, collect events; call `close()` at end of stream."""

    def __init__(self, max_event_bytes: int = 64 * 1024 * 1024) -> None:
        self._buf = bytearray()
        self._data: list[str] = []
        self._event = ""
        self._id: str | None = None
        self._pending_cr = False
        self._scanned = 0  # bytes of the held partial line already searched for a line end
        self._payload = 0  # bytes of complete non-comment lines
        self.max_event_bytes = max_event_bytes
        self.comments = 0

    @property
    def payload_bytes(self) -> int:
        """Bytes of non-comment lines so far, the partial line held included.

        It grows while an event arrives, however slowly and in however many reads, and
        not for keep-alive comments: a client's measure of "the server is still talking".
        """
        held = len(self._buf) if self._buf[:1] != b":" else 0
        return self._payload + held

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Parse what `chunk` completes; keep the rest for the next call."""
        out: list[SSEEvent] = []
        buf = self._buf
        buf += chunk
        start = 0
        if self._pending_cr and buf[:1] == b"\n":
            start = 1  # the LF of a CRLF split across two reads
        self._pending_cr = False
        n = len(buf)
        scan = max(start, self._scanned)  # a long line arriving in many reads is scanned once
        while start < n:
            lf = buf.find(b"\n", scan)
            cr = buf.find(b"\r", scan, lf if lf >= 0 else n)
            if cr >= 0:
                end, nxt = cr, cr + 1
                if nxt < n and buf[nxt] == 0x0A:
                    nxt += 1
                elif nxt == n:
                    self._pending_cr = True
            elif lf >= 0:
                end, nxt = lf, lf + 1
            else:
                break
            if end > start and buf[start] != 0x3A:  # not a ":" comment
                self._payload += end - start
            self._line(bytes(buf[start:end]).decode("utf-8", errors="replace"), out)
            start = scan = nxt
        del buf[:start]
        self._scanned = len(buf)
        if len(buf) > self.max_event_bytes:
            raise ValueError(f"SSE line longer than {self.max_event_bytes} bytes")
        return out

    def close(self) -> list[SSEEvent]:
        """End of stream: a last line without its newline, and an undispatched event."""
        out: list[SSEEvent] = []
        if self._buf:
            self._line(bytes(self._buf).decode("utf-8", errors="replace"), out)
            self._buf.clear()
        self._line("", out)
        return out

    def _line(self, line: str, out: list[SSEEvent]) -> None:
        if not line:
            if self._data:
                out.append(SSEEvent("\n".join(self._data), self._event or "message", self._id))
            self._data, self._event = [], ""
            return
        if line[0] == ":":
            self.comments += 1
            return
        field, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._data.append(value)
        elif field == "event":
            self._event = value
        elif field == "id" and "\0" not in value:
            self._id = value
        # "retry" and unknown fields are ignored, as the spec says.


class LineParser:
    """NDJSON as `SSEParser` gives events: each non-empty line is one event's `data`
    (a line split across reads is held until its end arrives)."""

    def __init__(self, max_event_bytes: int = 64 * 1024 * 1024) -> None:
        self._buf = bytearray()
        self._payload = 0
        self.max_event_bytes = max_event_bytes

    @property
    def payload_bytes(self) -> int:
        """Bytes so far, the partial line held included (as `SSEParser`'s)."""
        return self._payload + len(self._buf)

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """The lines `chunk` completes; the rest is kept for the next call."""
        self._buf += chunk
        *lines, rest = bytes(self._buf).split(b"\n")
        self._payload += len(self._buf) - len(rest)
        self._buf = bytearray(rest)
        if len(self._buf) > self.max_event_bytes:
            raise ValueError(f"NDJSON line longer than {self.max_event_bytes} bytes")
        return [SSEEvent(t) for line in lines if (t := line.decode("utf-8", "replace").strip())]

    def close(self) -> list[SSEEvent]:
        """End of stream: a last line without its newline."""
        last = bytes(self._buf).decode("utf-8", "replace").strip()
        self._buf.clear()
        return [SSEEvent(last)] if last else []
