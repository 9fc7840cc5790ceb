"""What the fake GitHub server (fake_github.py) records and answers with: the request
log, injected failures, repositories, and GitHub's error bodies."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

JSON = dict[str, Any]
NOW = "2026-01-15T12:00:00Z"
DOCS = "https://docs.github.com/rest"
REACTIONS = ("+1", "-1", "laugh", "confused", "heart", "hooray", "rocket", "eyes")
ROLE_NAMES = {"admin": "admin", "maintain": "maintain", "write": "write", "triage": "triage",
               "read": "read", "none": "none"}
# GitHub's `permission` field only knows admin/write/read/none; role_name has the rest.
PERMISSION_FIELD = {"admin": "admin", "maintain": "write", "write": "write",
                     "triage": "read", "read": "read", "none": "none"}
_MESSAGES = {400: "Bad Request", 401: "Bad credentials", 403: "Forbidden", 404: "Not Found",
             409: "Conflict", 422: "Validation Failed", 429: "Too Many Requests",
             500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable"}


@dataclass(frozen=True)
class Call:
    """One request as the server saw it (recorded even when it was refused)."""

    method: str
    path: str
    query: dict[str, str]
    json: Any
    authorization: str | None
    status: int

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


@dataclass
class Failure:
    method: str
    path_regex: str
    status: int
    body: Any
    headers: dict[str, str]
    times: int


@dataclass
class Repo:
    full_name: str
    id: int
    default_branch: str
    fork: bool
    private: bool
    parent: str | None
    branches: dict[str, str] = field(default_factory=dict)
    bare: Path | None = None


class Reply(Exception):
    """Raised inside a handler to answer with a status and a JSON body."""

    def __init__(self, status: int, body: Any = None, headers: dict[str, str] | None = None):
        super().__init__(status)
        self.status = status
        self.body = body if body is not None else error_body(status)
        self.headers = headers or {}


def error_body(status: int, message: str | None = None) -> JSON:
    return {"message": message or _MESSAGES.get(status, "Error"), "documentation_url": DOCS,
            "status": str(status)}


def validation(message: str | None = None, field_name: str | None = None,
                code: str = "custom", resource: str = "PullRequest") -> Reply:
    error: JSON = {"resource": resource, "code": code}
    if message is not None:
        error["message"] = message
    if field_name is not None:
        error["field"] = field_name
    return Reply(422, {"message": "Validation Failed", "errors": [error],
                        "documentation_url": DOCS, "status": "422"})
