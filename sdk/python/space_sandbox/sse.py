"""Server-sent events: a parser for one connection's byte lines."""


class Event:
    """One SSE event: id (str, "" if none), type ("message" if none) and data (str)."""

    __slots__ = ("id", "type", "data", "retry")

    def __init__(self, id="", type="message", data="", retry=None):
        self.id, self.type, self.data, self.retry = id, type, data, retry

    def __repr__(self):
        return f"Event(id={self.id!r}, type={self.type!r}, data={self.data[:40]!r})"


def parse(lines):
    """Yield Events from an iterable of raw lines (bytes, with line endings).

    Follows the WHATWG rules that matter here: comments (":") are skipped,
    several data lines join with "\\n", an event is dispatched at a blank
    line, and an incomplete event at the end of the input is dropped (the
    connection broke in the middle of it)."""
    eid, etype, data, retry, has = "", "", [], None, False
    for raw in lines:
        if not raw.endswith(b"\n") and not raw.endswith(b"\r"):
            return  # a partial last line: the connection was cut mid-event
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if line == "":
            if has:
                yield Event(eid, etype or "message", "\n".join(data), retry)
            etype, data, retry, has = "", [], None, False
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            data.append(value)
            has = True
        elif field == "event":
            etype = value
            has = True
        elif field == "id":
            if "\0" not in value:
                eid = value
        elif field == "retry" and value.isdigit():
            retry = int(value)
