"""Stop strings over a token stream: hold back only text that may start a stop string."""

from __future__ import annotations

from collections.abc import Iterable


class StopMatcher:
    """Feed decoded text; get back the text safe to show and whether a stop was hit.

    Text that could be the start of a stop string is held until the next piece decides
    it, so a stop string split across tokens is never shown.
    """

    def __init__(self, stops: Iterable[str]) -> None:
        self.stops = tuple(dict.fromkeys(s for s in stops if s))
        self._longest = max((len(s) for s in self.stops), default=0)
        self._held = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Returns (text to emit, stopped). After a stop, the text after it is dropped."""
        if not self.stops:
            return text, False
        buf = self._held + text
        cut = min((i for i in (buf.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self._held = ""
            return buf[:cut], True
        keep = self._partial_suffix(buf)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self, text: str = "") -> str:
        """End of stream: whatever was held is real text after all."""
        out, self._held = self._held + text, ""
        return out

    def _partial_suffix(self, buf: str) -> int:
        """Length of the longest suffix of `buf` that is a proper prefix of a stop string."""
        for n in range(min(len(buf), self._longest - 1), 0, -1):
            tail = buf[-n:]
            if any(s.startswith(tail) for s in self.stops):
                return n
        return 0
