"""Typed exceptions mapped from SPACE's error envelope {"error": {"code", "message"}}."""


class SpaceError(Exception):
    """Base class of every error this SDK raises.

    status is the HTTP status (0 when there was no HTTP answer), code the
    envelope's machine-readable code (e.g. "not_found"), message its text."""

    def __init__(self, message, status=0, code="", method="", url=""):
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.method = method
        self.url = url

    def __str__(self):
        where = f"{self.method} {self.url}: " if self.method else ""
        if self.status:
            return f"{where}HTTP {self.status} {self.code or '?'}: {self.message}"
        return f"{where}{self.message}"


class APIError(SpaceError):
    """The server answered with an error status."""


class InvalidArgument(APIError):
    """400: the request is invalid (invalid_argument, invalid_json, unknown_field, invalid_body, invalid_path)."""


class Unauthorized(APIError):
    """401: missing, wrong or revoked credentials."""


class TokenExpired(Unauthorized):
    """401 token_expired: the data-plane session token expired (the SDK renews it once on its own)."""


class Forbidden(APIError):
    """403."""


class NotFound(APIError):
    """404: the resource does not exist or is not visible to the caller."""


class Conflict(APIError):
    """409: the resource is not in a state that allows this."""


class SandboxPaused(Conflict):
    """409 sandbox_paused: the data plane refuses a paused sandbox; resume it first."""


class Gone(APIError):
    """410 events_gone: the requested output position is no longer retained."""


class TooLarge(APIError):
    """413 body_too_large."""


class UnsupportedMediaType(InvalidArgument):
    """415 unsupported_media_type."""


class ResourceExhausted(APIError):
    """429 resource_exhausted: a quota or capacity limit was reached."""


class InternalError(APIError):
    """500 internal."""


class AgentError(APIError):
    """502 agent_error: the in-sandbox agent failed."""


class Unavailable(APIError):
    """503 unavailable: retry later."""


class DeadlineExceeded(APIError):
    """504 deadline_exceeded."""


class ConnectionFailed(SpaceError):
    """No HTTP answer: connection refused, reset or timed out."""


class StreamError(SpaceError):
    """An output stream could not be resumed (too many failed reconnections)."""


class OperationFailed(SpaceError):
    """A long-running operation ended failed or cancelled. operation is the Operation."""

    def __init__(self, message, operation=None):
        err = (operation or {}).get("error") or {}
        super().__init__(message, code=err.get("code", ""))
        self.operation = operation


class Timeout(SpaceError):
    """A client-side wait (operation, command) ran out of time."""


_BY_CODE = {
    "invalid_argument": InvalidArgument,
    "invalid_json": InvalidArgument,
    "unknown_field": InvalidArgument,
    "invalid_body": InvalidArgument,
    "invalid_path": InvalidArgument,
    "unsupported_media_type": UnsupportedMediaType,
    "unauthorized": Unauthorized,
    "token_expired": TokenExpired,
    "forbidden": Forbidden,
    "not_found": NotFound,
    "route_not_found": NotFound,
    "conflict": Conflict,
    "sandbox_paused": SandboxPaused,
    "events_gone": Gone,
    "body_too_large": TooLarge,
    "resource_exhausted": ResourceExhausted,
    "internal": InternalError,
    "agent_error": AgentError,
    "unavailable": Unavailable,
    "deadline_exceeded": DeadlineExceeded,
}

_BY_STATUS = {
    400: InvalidArgument,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    413: TooLarge,
    415: UnsupportedMediaType,
    429: ResourceExhausted,
    500: InternalError,
    502: AgentError,
    503: Unavailable,
    504: DeadlineExceeded,
}


def error_for(status, code, message, method="", url=""):
    """The exception for an HTTP error answer: by envelope code first, then by status."""
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status) or APIError
    return cls(message, status=status, code=code, method=method, url=url)
