"""The server's errors, as OpenAI's API shapes them: ``{"error": {message, type, param, code}}``."""

from __future__ import annotations

from typing import Any

# The error ``type`` OpenAI's (and vLLM's) server gives each HTTP status.
_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
          405: "MethodNotAllowedError", 429: "RateLimitError", 500: "InternalServerError",
          503: "ServiceUnavailableError"}


class ApiError(Exception):
    """A request the server answers with ``status`` and an OpenAI-style body;
    ``param`` names the request field at fault, where there is one."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.status, self.param)


def error_body(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": _TYPES.get(status, "Error"), "param": param,
                      "code": status}}
