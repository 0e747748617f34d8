"""Provider errors → one normalized code (the ProviderErrorCode of the .proto).

FinishGeneration gets what the caller saw: the HTTP status, the provider's error `type` and `code`,
and its message. Only the code derived here is stored, never the message or the body. The rules,
first match wins:

1. a known error `code` (OpenAI `error.code`, a Gemini ErrorInfo reason or block reason, or one of
   the normalized codes themselves, as the deprecated `error_code` field carries them);
2. the message, for the kinds some providers give only in text: a context window overflow
   (Anthropic "prompt is too long", Gemini "input token count ... exceeds the maximum", vLLM and
   Mistral "maximum context length") and a content filter;
3. a known error `type` (OpenAI / Anthropic `error.type`, Gemini `error.status`, SDK exception
   class names);
4. the HTTP status;
5. UNKNOWN.
"""

from __future__ import annotations

import re
from enum import StrEnum


class ErrorCode(StrEnum):
    """The normalized codes; their names are the ProviderErrorCode values without the prefix."""

    CONTEXT_LENGTH_EXCEEDED = "CONTEXT_LENGTH_EXCEEDED"
    RATE_LIMITED = "RATE_LIMITED"
    AUTHENTICATION_FAILED = "AUTHENTICATION_FAILED"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    INVALID_REQUEST = "INVALID_REQUEST"
    CONTENT_FILTERED = "CONTENT_FILTERED"
    TIMEOUT = "TIMEOUT"
    PROVIDER_UNAVAILABLE = "PROVIDER_UNAVAILABLE"
    UNKNOWN = "UNKNOWN"


_C = ErrorCode

# Provider error codes and types, lower-cased (`code` is read first, then `type`).
_NAMES: dict[str, ErrorCode] = {
    # Context window.
    "context_length_exceeded": _C.CONTEXT_LENGTH_EXCEEDED,  # OpenAI, Groq, Azure OpenAI
    "contextwindowexceedederror": _C.CONTEXT_LENGTH_EXCEEDED,  # LiteLLM
    "exceed_context_size_error": _C.CONTEXT_LENGTH_EXCEEDED,  # llama.cpp server
    # Rate limits and quota.
    "rate_limit_exceeded": _C.RATE_LIMITED,  # OpenAI
    "rate_limit_error": _C.RATE_LIMITED,  # Anthropic
    "insufficient_quota": _C.RATE_LIMITED,  # OpenAI (HTTP 429)
    "resource_exhausted": _C.RATE_LIMITED,  # Gemini
    "ratelimiterror": _C.RATE_LIMITED,  # OpenAI / Anthropic SDKs, LiteLLM
    "too_many_requests": _C.RATE_LIMITED,
    # Credentials.
    "invalid_api_key": _C.AUTHENTICATION_FAILED,  # OpenAI
    "invalid_authentication": _C.AUTHENTICATION_FAILED,  # OpenAI
    "authentication_error": _C.AUTHENTICATION_FAILED,  # Anthropic
    "unauthenticated": _C.AUTHENTICATION_FAILED,  # Gemini
    "api_key_invalid": _C.AUTHENTICATION_FAILED,  # Gemini ErrorInfo reason
    "authenticationerror": _C.AUTHENTICATION_FAILED,  # SDKs
    # Permissions.
    "permission_error": _C.PERMISSION_DENIED,  # Anthropic
    "permission_denied": _C.PERMISSION_DENIED,  # Gemini
    "permissiondeniederror": _C.PERMISSION_DENIED,  # SDKs
    "unsupported_country_region_territory": _C.PERMISSION_DENIED,  # OpenAI
    "billing_error": _C.PERMISSION_DENIED,  # Anthropic (HTTP 402)
    # Malformed or unknown requests.
    "invalid_request_error": _C.INVALID_REQUEST,  # OpenAI, Anthropic, Mistral
    "not_found_error": _C.INVALID_REQUEST,  # Anthropic
    "request_too_large": _C.INVALID_REQUEST,  # Anthropic (HTTP 413: bytes, not tokens)
    "model_not_found": _C.INVALID_REQUEST,  # OpenAI
    "invalid_argument": _C.INVALID_REQUEST,  # Gemini
    "failed_precondition": _C.INVALID_REQUEST,  # Gemini
    "not_found": _C.INVALID_REQUEST,  # Gemini
    "out_of_range": _C.INVALID_REQUEST,  # Gemini
    "badrequesterror": _C.INVALID_REQUEST,  # SDKs, vLLM
    "notfounderror": _C.INVALID_REQUEST,  # SDKs
    "unprocessableentityerror": _C.INVALID_REQUEST,  # SDKs
    # Safety filters.
    "content_filter": _C.CONTENT_FILTERED,  # OpenAI, Azure OpenAI
    "content_policy_violation": _C.CONTENT_FILTERED,  # OpenAI images
    "safety": _C.CONTENT_FILTERED,  # Gemini block reason
    "prohibited_content": _C.CONTENT_FILTERED,  # Gemini block reason
    "blocklist": _C.CONTENT_FILTERED,  # Gemini block reason
    "spii": _C.CONTENT_FILTERED,  # Gemini block reason
    "contentpolicyviolationerror": _C.CONTENT_FILTERED,  # LiteLLM
    # Timeouts.
    "timeout_error": _C.TIMEOUT,  # Anthropic
    "deadline_exceeded": _C.TIMEOUT,  # Gemini
    "timeout": _C.TIMEOUT,
    "apitimeouterror": _C.TIMEOUT,  # OpenAI / Anthropic SDKs
    # The provider's side.
    "api_error": _C.PROVIDER_UNAVAILABLE,  # Anthropic
    "overloaded_error": _C.PROVIDER_UNAVAILABLE,  # Anthropic
    "server_error": _C.PROVIDER_UNAVAILABLE,  # OpenAI
    "engine_overloaded": _C.PROVIDER_UNAVAILABLE,  # OpenAI
    "unavailable": _C.PROVIDER_UNAVAILABLE,  # Gemini
    "internal": _C.PROVIDER_UNAVAILABLE,  # Gemini
    "internalservererror": _C.PROVIDER_UNAVAILABLE,  # SDKs
    "serviceunavailableerror": _C.PROVIDER_UNAVAILABLE,  # LiteLLM
    "apiconnectionerror": _C.PROVIDER_UNAVAILABLE,  # SDKs: no answer at all
} | {code.value.lower(): code for code in ErrorCode}  # the normalized codes, as `error_code` sends them

# Errors some providers tell only in their text. Read, never stored.
_CONTEXT_MESSAGE = re.compile(
    r"maximum context length"  # OpenAI, vLLM, Mistral
    r"|context (?:length|window|size)"
    r"|prompt is too long"  # Anthropic
    r"|input token count.*exceeds"  # Gemini
    r"|exceeds the maximum number of tokens"
    r"|too many (?:input )?tokens",
    re.IGNORECASE,
)
_FILTER_MESSAGE = re.compile(r"content (?:management )?policy|content filter|safety (?:system|filter)", re.I)

_BY_STATUS: dict[int, ErrorCode] = {
    400: _C.INVALID_REQUEST,
    401: _C.AUTHENTICATION_FAILED,
    402: _C.PERMISSION_DENIED,
    403: _C.PERMISSION_DENIED,
    404: _C.INVALID_REQUEST,
    408: _C.TIMEOUT,
    409: _C.INVALID_REQUEST,
    413: _C.INVALID_REQUEST,
    422: _C.INVALID_REQUEST,
    429: _C.RATE_LIMITED,
    504: _C.TIMEOUT,
    524: _C.TIMEOUT,  # Cloudflare: the origin timed out
}


def normalize(http_status: int = 0, error_type: str = "", code: str = "", message: str = "") -> ErrorCode:
    """The normalized code of a provider error (see the module's rules)."""
    by_code = _NAMES.get(code.strip().lower())
    if by_code is not None:
        return by_code
    if _CONTEXT_MESSAGE.search(message):
        return ErrorCode.CONTEXT_LENGTH_EXCEEDED
    if _FILTER_MESSAGE.search(message):
        return ErrorCode.CONTENT_FILTERED
    by_type = _NAMES.get(error_type.strip().lower())
    if by_type is not None:
        return by_type
    status = http_status or _numeric(code)
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    if 500 <= status <= 599:
        return ErrorCode.PROVIDER_UNAVAILABLE
    return ErrorCode.UNKNOWN


def _numeric(code: str) -> int:
    """Gemini and vLLM bodies carry the HTTP status as their `code`."""
    return int(code) if code.strip().isdigit() else 0
