# Copyright 2026 The Kubernetes Authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.

import re
from datetime import datetime, timezone
from typing import Literal, Optional, Union
from pydantic import BaseModel, field_validator

class ExecutionResult(BaseModel):
    """A structured object for holding the result of a command execution."""
    stdout: str = ""  # Standard output from the command.
    stderr: str = ""  # Standard error from the command.
    exit_code: int = -1  # Exit code of the command.

class FileEntry(BaseModel):
    """Represents a file or directory entry in the sandbox.

    Runtime-neutral: the SDK decodes both the legacy python-runtime wire
    format (``mod_time`` as a float POSIX timestamp) and the sandboxd wire
    format (``modified_at`` as an RFC 3339 string, plus ``mode``) into this
    one shape. ``modified`` is always a timezone-aware datetime.
    """
    name: str  # Name of the file.
    size: int  # Size of the file in bytes.
    type: Literal["file", "directory"]  # Type of the entry (file or directory).
    modified: datetime  # Last modification time (timezone-aware).
    mode: Optional[str] = None  # Octal permission bits (sandboxd only), e.g. "0644".

    @classmethod
    def from_legacy(cls, entry: dict) -> "FileEntry":
        """Build from the legacy python-runtime listing entry."""
        return cls(
            name=entry["name"],
            size=entry["size"],
            type=entry["type"],
            modified=datetime.fromtimestamp(entry.get("mod_time", 0), tz=timezone.utc),
        )

    @classmethod
    def from_sandboxd(cls, entry: dict) -> "FileEntry":
        """Build from a sandboxd DirectoryListing entry."""
        return cls(
            name=entry["name"],
            size=entry["size"],
            type=entry["type"],
            modified=datetime.fromisoformat(entry["modified_at"].replace("Z", "+00:00")),
            mode=entry.get("mode"),
        )

class SandboxDirectConnectionConfig(BaseModel):
    """Configuration for connecting directly to a Sandbox URL."""
    api_url: str  # Direct URL to the router.
    server_port: int = 8888  # Port the sandbox container listens on.

class SandboxGatewayConnectionConfig(BaseModel):
    """Configuration for connecting via Kubernetes Gateway API."""
    gateway_name: str  # Name of the Gateway resource.
    gateway_namespace: str = "default"  # Namespace where the Gateway resource resides.
    gateway_ready_timeout: int = 180  # Timeout in seconds to wait for Gateway IP.
    server_port: int = 8888  # Port the sandbox container listens on.

class SandboxLocalTunnelConnectionConfig(BaseModel):
    """Configuration for connecting via kubectl port-forward."""
    port_forward_ready_timeout: int = 30  # Timeout in seconds to wait for port-forward to be ready.
    server_port: int = 8888  # Port the sandbox container listens on.
    router_namespace: str = "agent-sandbox-system"  # Namespace where the Router service resides.

    @field_validator("router_namespace")
    @classmethod
    def validate_namespace(cls, v: str) -> str:
        if not re.match(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", v):
            raise ValueError("Invalid Kubernetes namespace name format")
        return v

class SandboxdPodTunnelConnectionConfig(BaseModel):
    """Configuration for the sandboxd runtime via a direct pod port-forward.

    sandboxd (KEP-539.2) exposes two listeners: the Filesystem & Runtime REST
    API and the gRPC ProcessService. This config port-forwards directly to the
    sandbox pod, reaching both.
    """
    rest_port: int = 8080  # sandboxd REST filesystem port on the pod.
    grpc_port: int = 9090  # sandboxd gRPC ProcessService port on the pod.
    port_forward_ready_timeout: int = 30  # Seconds to wait for port-forward readiness.

    @field_validator("rest_port", "grpc_port")
    @classmethod
    def validate_port(cls, v: int) -> int:
        if v < 1 or v > 65535:
            raise ValueError("port must be between 1 and 65535")
        return v

class SandboxInClusterConnectionConfig(BaseModel):
    """Configuration for direct in-cluster connection to the sandbox pod, bypassing the router.

    The client first uses the pod IP reported in the Sandbox status. If the pod IP
    is unavailable, it falls back to the stable Kubernetes DNS endpoint:
        http://{sandbox_id}.{namespace}.svc.cluster.local:{server_port}
    """
    server_port: int = 8888  # Port the sandbox container listens on.

SandboxConnectionConfig = Union[
    SandboxDirectConnectionConfig,
    SandboxGatewayConnectionConfig,
    SandboxLocalTunnelConnectionConfig,
    SandboxInClusterConnectionConfig,
    SandboxdPodTunnelConnectionConfig,
]

class SandboxTracerConfig(BaseModel):
    """Configuration for tracer level information"""
    enable_tracing: bool = False  # Whether to enable OpenTelemetry tracing.
    trace_service_name: str = "sandbox-client"  # Service name used for traces.
    