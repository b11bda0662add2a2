"""SPACE Python SDK: run untrusted code in SPACE sandboxes (standard library only).

    from space_sandbox import Client
    client = Client("http://127.0.0.1:7070", api_key)          # or $SPACE_URL / $SPACE_API_KEY
    with client.create_sandbox("minimal") as sb:                 # waits until it runs
        r = sb.run("echo hello; echo oops >&2", on_stdout=print)
        print(r.exit_code, r.stdout, r.stderr)
        sb.files.upload("/tmp/data.bin", open("data.bin", "rb"))  # streamed
"""

from .client import Client, Command, CommandError, Files, OutputStream, Sandbox
from .errors import (AgentError, APIError, Conflict, ConnectionFailed, DeadlineExceeded, Forbidden, Gone,
                     InternalError, InvalidArgument, NotFound, OperationFailed, ResourceExhausted, SandboxPaused,
                     SpaceError, StreamError, Timeout, TokenExpired, TooLarge, Unauthorized, Unavailable,
                     UnsupportedMediaType)
from .models import (CodeError, CodeResult, CommandInfo, CommandResult, Execution, FileInfo, Operation, OutputEvent, Port, SandboxInfo, Session,
                     SignedURL, Snapshot, Template)

__version__ = "0.1.0"

__all__ = [
    "Client", "Sandbox", "Command", "CommandError", "Files", "OutputStream",
    "SpaceError", "APIError", "InvalidArgument", "Unauthorized", "TokenExpired", "Forbidden", "NotFound",
    "Conflict", "SandboxPaused", "Gone", "TooLarge", "UnsupportedMediaType", "ResourceExhausted", "InternalError",
    "AgentError", "Unavailable", "DeadlineExceeded", "ConnectionFailed", "StreamError", "OperationFailed", "Timeout",
    "CodeError", "CodeResult", "Execution", "CommandInfo", "CommandResult", "FileInfo", "Operation", "OutputEvent", "Port", "SandboxInfo", "Session",
    "SignedURL", "Snapshot", "Template",
]
