"""Provider errors → the normalized code FinishGeneration stores, on error responses as OpenAI,
Anthropic, Google (Gemini) and OpenAI-compatible servers send them (HTTP status, the body's error
type and code, its message), as their documentation shows them."""

from __future__ import annotations

import pytest

from contextshift.audit.provider_errors import ErrorCode, normalize

C = ErrorCode

# (who, HTTP status, error type, error code, message, expected)
CASES: list[tuple[str, int, str, str, str, ErrorCode]] = [
    # OpenAI: {"error": {"message", "type", "param", "code"}}.
    (
        "openai context",
        400,
        "invalid_request_error",
        "context_length_exceeded",
        "This model's maximum context length is 128000 tokens. However, your messages resulted in 130412 "
        "tokens. Please reduce the length of the messages.",
        C.CONTEXT_LENGTH_EXCEEDED,
    ),
    (
        "openai RPM",
        429,
        "requests",
        "rate_limit_exceeded",
        "Rate limit reached for gpt-4o in organization org-abc on requests per min (RPM): Limit 3, Used 3, "
        "Requested 1. Please try again in 20s.",
        C.RATE_LIMITED,
    ),
    (
        "openai TPM",
        429,
        "tokens",
        "rate_limit_exceeded",
        "Request too large for gpt-4o in organization org-abc on tokens per min (TPM): Limit 30000, "
        "Requested 42000. The input or output tokens must be reduced in order to run successfully.",
        C.RATE_LIMITED,
    ),
    (
        "openai quota",
        429,
        "insufficient_quota",
        "insufficient_quota",
        "You exceeded your current quota, please check your plan and billing details.",
        C.RATE_LIMITED,
    ),
    (
        "openai key",
        401,
        "invalid_request_error",
        "invalid_api_key",
        "Incorrect API key provided: sk-abc***xyz. You can find your API key at "
        "https://platform.openai.com/account/api-keys.",
        C.AUTHENTICATION_FAILED,
    ),
    (
        "openai region",
        403,
        "request_forbidden",
        "unsupported_country_region_territory",
        "Country, region, or territory not supported",
        C.PERMISSION_DENIED,
    ),
    (
        "openai model",
        404,
        "invalid_request_error",
        "model_not_found",
        "The model `gpt-9` does not exist or you do not have access to it.",
        C.INVALID_REQUEST,
    ),
    (
        "openai server",
        500,
        "server_error",
        "",
        "The server had an error while processing your request. Sorry about that!",
        C.PROVIDER_UNAVAILABLE,
    ),
    (
        "openai overloaded",
        503,
        "",
        "",
        "The engine is currently overloaded, please try again later.",
        C.PROVIDER_UNAVAILABLE,
    ),
    (
        "azure openai filter",
        400,
        "",
        "content_filter",
        "The response was filtered due to the prompt triggering Azure OpenAI's content management policy.",
        C.CONTENT_FILTERED,
    ),
    (
        "openai images policy",
        400,
        "invalid_request_error",
        "content_policy_violation",
        "Your request was rejected as a result of our safety system.",
        C.CONTENT_FILTERED,
    ),
    ("openai SDK timeout", 0, "APITimeoutError", "", "Request timed out.", C.TIMEOUT),
    ("openai SDK connection", 0, "APIConnectionError", "", "Connection error.", C.PROVIDER_UNAVAILABLE),
    # Anthropic: {"type": "error", "error": {"type", "message"}}.
    (
        "anthropic context",
        400,
        "invalid_request_error",
        "",
        "prompt is too long: 208310 tokens > 200000 maximum",
        C.CONTEXT_LENGTH_EXCEEDED,
    ),
    (
        "anthropic invalid",
        400,
        "invalid_request_error",
        "",
        'messages: roles must alternate between "user" and "assistant", but found multiple "user" roles in a row',
        C.INVALID_REQUEST,
    ),
    ("anthropic key", 401, "authentication_error", "", "invalid x-api-key", C.AUTHENTICATION_FAILED),
    (
        "anthropic billing",
        402,
        "billing_error",
        "",
        "Your credit balance is too low to access the Anthropic API.",
        C.PERMISSION_DENIED,
    ),
    (
        "anthropic permission",
        403,
        "permission_error",
        "",
        "Your API key does not have permission to use the specified resource.",
        C.PERMISSION_DENIED,
    ),
    ("anthropic not found", 404, "not_found_error", "", "model: claude-9", C.INVALID_REQUEST),
    (
        "anthropic size",
        413,
        "request_too_large",
        "",
        "Request exceeds the maximum allowed number of bytes.",
        C.INVALID_REQUEST,
    ),
    (
        "anthropic rate",
        429,
        "rate_limit_error",
        "",
        "This request would exceed the rate limit for your organization of 40,000 input tokens per minute.",
        C.RATE_LIMITED,
    ),
    ("anthropic api", 500, "api_error", "", "Internal server error", C.PROVIDER_UNAVAILABLE),
    ("anthropic overloaded", 529, "overloaded_error", "", "Overloaded", C.PROVIDER_UNAVAILABLE),
    ("anthropic timeout", 504, "timeout_error", "", "Request timed out", C.TIMEOUT),
    # Google Gemini: {"error": {"code", "message", "status", "details": [ErrorInfo(reason)]}}.
    (
        "gemini context",
        400,
        "INVALID_ARGUMENT",
        "",
        "The input token count (1212345) exceeds the maximum number of tokens allowed (1048576).",
        C.CONTEXT_LENGTH_EXCEEDED,
    ),
    (
        "gemini key",
        400,
        "INVALID_ARGUMENT",
        "API_KEY_INVALID",
        "API key not valid. Please pass a valid API key.",
        C.AUTHENTICATION_FAILED,
    ),
    (
        "gemini region",
        400,
        "FAILED_PRECONDITION",
        "",
        "User location is not supported for the API use.",
        C.INVALID_REQUEST,
    ),
    (
        "gemini permission",
        403,
        "PERMISSION_DENIED",
        "",
        "The caller does not have permission",
        C.PERMISSION_DENIED,
    ),
    (
        "gemini model",
        404,
        "NOT_FOUND",
        "",
        "models/gemini-9 is not found for API version v1beta, or is not supported for generateContent.",
        C.INVALID_REQUEST,
    ),
    (
        "gemini quota",
        429,
        "RESOURCE_EXHAUSTED",
        "",
        "You exceeded your current quota, please check your plan and billing details.",
        C.RATE_LIMITED,
    ),
    ("gemini internal", 500, "INTERNAL", "", "An internal error has occurred.", C.PROVIDER_UNAVAILABLE),
    (
        "gemini overloaded",
        503,
        "UNAVAILABLE",
        "",
        "The model is overloaded. Please try again later.",
        C.PROVIDER_UNAVAILABLE,
    ),
    (
        "gemini deadline",
        504,
        "DEADLINE_EXCEEDED",
        "",
        "Deadline expired before operation could complete.",
        C.TIMEOUT,
    ),
    # A prompt Gemini blocked comes back as HTTP 200 with promptFeedback.blockReason.
    ("gemini safety block", 200, "", "SAFETY", "", C.CONTENT_FILTERED),
    ("gemini prohibited", 200, "", "PROHIBITED_CONTENT", "", C.CONTENT_FILTERED),
    # Gemini's body carries the HTTP status as its numeric code.
    ("gemini body only", 0, "", "429", "Resource has been exhausted (e.g. check quota).", C.RATE_LIMITED),
    # OpenAI-compatible servers.
    (
        "vllm context",
        400,
        "BadRequestError",
        "400",
        "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the "
        "messages, 1000 in the completion). Please reduce the length of the messages or completion.",
        C.CONTEXT_LENGTH_EXCEEDED,
    ),
    (
        "mistral context",
        400,
        "invalid_request_error",
        "",
        "Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 maximum context length",
        C.CONTEXT_LENGTH_EXCEEDED,
    ),
    (
        "llama.cpp context",
        400,
        "exceed_context_size_error",
        "400",
        "the request exceeds the available context size, try increasing it",
        C.CONTEXT_LENGTH_EXCEEDED,
    ),
    (
        "groq TPM",
        413,
        "tokens",
        "rate_limit_exceeded",
        "Request too large for model `llama-3.3-70b-versatile` on tokens per minute (TPM): Limit 6000, Requested 9000",
        C.RATE_LIMITED,
    ),
    ("litellm context", 400, "ContextWindowExceededError", "", "", C.CONTEXT_LENGTH_EXCEEDED),
    ("openrouter credits", 402, "", "402", "Insufficient credits", C.PERMISSION_DENIED),
    ("openrouter timeout", 408, "", "408", "Your request timed out", C.TIMEOUT),
    (
        "openrouter down",
        502,
        "",
        "502",
        "Your chosen model is down or we received an invalid response from it.",
        C.PROVIDER_UNAVAILABLE,
    ),
    ("ollama not found", 404, "", "", "model 'llama9' not found, try pulling it first", C.INVALID_REQUEST),
    (
        "ollama memory",
        500,
        "",
        "",
        "model requires more system memory (32 GiB) than is available",
        C.PROVIDER_UNAVAILABLE,
    ),
    ("cloudflare timeout", 524, "", "", "", C.TIMEOUT),
    # The deprecated `error_code` field: the normalized codes in any case, or a provider's code.
    ("error_code normalized", 0, "", "rate_limited", "", C.RATE_LIMITED),
    ("error_code upper", 0, "", "CONTEXT_LENGTH_EXCEEDED", "", C.CONTEXT_LENGTH_EXCEEDED),
    ("error_code provider's", 0, "", "overloaded_error", "", C.PROVIDER_UNAVAILABLE),
    # Nothing recognisable.
    ("nothing", 0, "", "", "", C.UNKNOWN),
    ("unknown code", 0, "", "weird", "something odd", C.UNKNOWN),
    ("teapot", 418, "", "", "I'm a teapot", C.UNKNOWN),
]


@pytest.mark.parametrize(
    ("http_status", "error_type", "code", "message", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_provider_errors_normalize(
    http_status: int, error_type: str, code: str, message: str, expected: ErrorCode
) -> None:
    assert normalize(http_status, error_type, code, message) is expected


def test_every_code_is_reachable() -> None:
    assert {case[-1] for case in CASES} == set(ErrorCode)
