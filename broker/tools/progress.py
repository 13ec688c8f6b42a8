"""Progress of long-running commands (``mq-bench``): on a terminal, one live status line rewritten in
place (rate, elapsed, ETA); otherwise nothing extra — the command's periodic plain report lines are the
progress, as they are in logs and pipes.

``StatusLine.println`` prints a regular line above the status line (clearing it first, redrawing it
after), so report lines and the live line never interleave on screen."""

from __future__ import annotations

from typing import TextIO

CLEAR = "\r\x1b[2K"


def is_terminal(out: TextIO) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):  # closed or not a real stream
        return False


def format_eta(seconds: float) -> str:
    s = max(0, round(seconds))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m:02d}:{sec:02d}"


def progress_text(done: int, unit: str, elapsed_s: float, total_s: float | None, extra: str = "") -> str:
    """``12,345 msgs | 1,023 msgs/s | 00:12 / 00:30 | ETA 00:18`` (+ ``extra``)."""
    rate = done / elapsed_s if elapsed_s > 0 else 0.0
    parts = [f"{done:,} {unit}", f"{rate:,.0f} {unit}/s"]
    if total_s is not None:
        parts.append(f"{format_eta(elapsed_s)} / {format_eta(total_s)}")
        parts.append(f"ETA {format_eta(max(0.0, total_s - elapsed_s))}")
    else:
        parts.append(format_eta(elapsed_s))
    if extra:
        parts.append(extra)
    return " | ".join(parts)


class StatusLine:
    """A live line on a terminal; inert (every call a no-op but ``println``) elsewhere."""

    def __init__(self, out: TextIO, *, live: bool | None = None, width: int = 160):
        self.out = out
        self.live = is_terminal(out) if live is None else live
        self.width = width
        self._text = ""

    def update(self, text: str) -> None:
        if not self.live:
            return
        self._text = text[: self.width]
        self.out.write(CLEAR + self._text)
        self.out.flush()

    def println(self, line: str) -> None:
        if self.live and self._text:
            self.out.write(CLEAR)
        print(line, file=self.out, flush=not self.live)
        if self.live and self._text:
            self.out.write(self._text)
        if self.live:
            self.out.flush()

    def close(self) -> None:
        if self.live and self._text:
            self.out.write(CLEAR)
            self.out.flush()
        self._text = ""
