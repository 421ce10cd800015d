"""Server settings: what the command line (or ``SPECDEC_*`` environment) decides, in one object."""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # importing specdec_core pulls in torch; `specdec --help` should not wait for it
    from specdec_core.engine.config import EngineConfig


def _default_engine_config() -> EngineConfig:
    from specdec_core.engine.config import EngineConfig

    return EngineConfig()


LogLevel = Literal["debug", "info", "warning", "error", "critical"]
# The default --max-prompt-chars per token of context: tokens average about 4 characters, and even
# runs of spaces or symbols rarely reach 16, so a longer prompt cannot fit and is not tokenized.
PROMPT_CHARS_PER_TOKEN = 64
UNRESOLVED_MAX_MODEL_LEN = 32768  # for the prompt size guard before an engine has resolved its context


def _flag(help: str, **extra: object) -> dict[str, object]:
    """``field`` metadata for a ``specdec serve`` flag (see ``server.cli_flags``)."""
    return {"help": help, "group": "http", **extra}


@dataclass
class ServerSettings:
    """Everything the HTTP layer needs; ``engine`` is handed to the engine as is.

    ``served_model_name=None`` serves the engine's own model name. At most ``max_queue``
    requests may wait beyond the engine's ``max_num_seqs`` running ones before new requests get
    429 (``None``, from Python only, admits without limit). ``shutdown_grace_s`` is how long a
    SIGTERM waits for in-flight requests before aborting them (env ``SPECDEC_SHUTDOWN_GRACE``).
    The ``max_*`` limits at the end bound the work one request can ask for (``server.api.limits``).
    """

    engine: EngineConfig = field(default_factory=_default_engine_config)
    host: str = field(default="127.0.0.1", metadata=_flag("address to listen on"))
    port: int = field(default=8000, metadata=_flag("port to listen on", minimum=0, maximum=65535))
    api_key: str | None = field(default=None, metadata=_flag(
        "require 'Authorization: Bearer KEY' (or Anthropic's 'x-api-key: KEY') on every /v1 route (/health and "
        "/metrics stay open); "
        "prefer the SPECDEC_API_KEY variable, which keeps the key out of the process list",
        # SPECDEC_API_KEY="" must be refused (see __post_init__), not read as "no key given".
        empty_is_value=True))
    served_model_name: str | None = field(default=None, metadata=_flag(
        "the model name clients send and /v1/models lists", group="models", default_help="the target's name"))
    # A GGUF's metadata may carry no template (Gemma 3 270M's has none); vLLM and llama.cpp take one here.
    chat_template: str | None = field(default=None, metadata=_flag(
        "the Jinja chat template /v1/chat/completions renders with: a file's path, or the template itself "
        "(inline text with '{{' or '{%%'); replaces the target tokenizer's own", group="models",
        default_help="the target tokenizer's own"))
    # --chat-template's text, read once at start (a replica elsewhere need not have the file)
    chat_template_text: str | None = field(default=None, init=False, repr=False)
    # A template is code from a model file: each render has a budget (server.services.template_pool).
    chat_template_timeout: float = field(default=10.0, metadata=_flag(
        "seconds a chat template may take to render one conversation; a render past it is stopped "
        "and the request gets 400", group="models", minimum=0.01))
    chat_template_max_chars: int = field(default=8 * 1024 * 1024, metadata=_flag(
        "characters a chat template may write for one conversation; more is stopped and the request "
        "gets 400", group="models", minimum=1))
    max_queue: int | None = field(default=256, metadata=_flag(
        "requests allowed to wait beyond --max-num-seqs running ones; more get 429 with Retry-After",
        minimum=0))
    log_level: LogLevel = field(default="info", metadata=_flag("server log level", ignore_case=True))
    shutdown_grace_s: float = 30.0
    # Requests larger than this are refused with 413 before they are parsed. 8 MiB holds any request
    # within the per-request limits below (131k prompt characters JSON-escaped, 128 x 2048 token
    # ids) and bounds what the JSON parser, which holds the GIL, can be made to chew on.
    max_body_bytes: int = 8 * 1024 * 1024
    # -- per-request limits and prompt safety (issue 13); over a limit is a 400 naming its flag ----
    max_stop_strings: int = field(default=16, metadata=_flag(
        "most 'stop' strings one request may give", minimum=0, group="limits"))
    max_stop_chars: int = field(default=4096, metadata=_flag(
        "most characters of all a request's 'stop' strings together", minimum=0, group="limits"))
    max_stop_token_ids: int = field(default=64, metadata=_flag(
        "most 'stop_token_ids' one request may give", minimum=0, group="limits"))
    max_prompt_chars: int | None = field(default=None, metadata=_flag(
        "most characters of prompt text one request may send (all its prompts, or all its messages' "
        "content), checked before tokenizing", minimum=1, group="limits",
        default_help=f"{PROMPT_CHARS_PER_TOKEN} x --max-model-len"))
    max_sequences_per_request: int = field(default=128, metadata=_flag(
        "most sequences one request may ask for: prompts x 'n'", minimum=1, group="limits"))
    max_messages: int = field(default=2048, metadata=_flag(
        "most messages one chat request may hold", minimum=1, group="limits"))
    # Parsing a body holds the GIL throughout (server.http.json_shape): its shape is counted first.
    max_body_containers: int = field(default=50_000, metadata=_flag(
        "most JSON arrays, objects and object keys one request body may hold (counted before parsing, "
        "which holds the event loop about 1 us for each)", minimum=1, group="limits"))
    max_body_values: int = field(default=524_288, metadata=_flag(
        "most JSON values one request body may hold, counted as the commas between them (before parsing; "
        "enough for 128 prompts of 4096 token ids)", minimum=1, group="limits"))
    # -- stored responses (/v1/responses with "store": true; issue 46): bounded, in this process ----
    responses_store_entries: int = field(default=1024, metadata=_flag(
        "most responses kept for 'previous_response_id' and GET /v1/responses/{id} (the least recently "
        "used go first; 0: none kept)", minimum=0, group="limits"))
    responses_store_bytes: int = field(default=64 * 1024 * 1024, metadata=_flag(
        "most bytes the stored responses may take together, each counted as its JSON", minimum=0, group="limits"))
    responses_store_ttl: int = field(default=3600, metadata=_flag(
        "seconds a stored response is kept", minimum=1, group="limits"))
    allow_special_tokens_in_content: bool = field(default=False, metadata=_flag(
        "encode special-token text inside chat messages (e.g. '<|im_end|>') as the special tokens "
        "themselves, as the chat template's own ones are; by default it is plain text, so a message "
        "cannot forge turns or roles"))

    @property
    def prompt_chars_limit(self) -> int:
        """``max_prompt_chars``, or by default a size no prompt that fits the context comes near."""
        if self.max_prompt_chars is not None:
            return self.max_prompt_chars
        # The engine resolves a default --max-model-len at start and writes it back into its
        # config; only a server without a real engine (tests' stand-in) still has None here.
        return PROMPT_CHARS_PER_TOKEN * (self.engine.max_model_len or UNRESOLVED_MAX_MODEL_LEN)

    # -- the HTTP edge: who may address the server, and how long a client may take (issue 13) --
    allowed_hosts: str | None = field(default=None, metadata=_flag(
        "comma-separated host names the Host header may carry ('*': any; '*.example.com': its subdomains); "
        "others get 400. Guards a key-less local server against DNS rebinding",
        default_help="localhost, 127.0.0.1, ::1 and --host when --host is a loopback address, else any"))
    header_timeout: int = field(default=10, metadata=_flag(
        "seconds a client may take to send a request's line and headers (from connecting, or from its "
        "first byte on a kept-alive connection); then 408 and the connection is closed", minimum=1))
    body_timeout: int = field(default=60, metadata=_flag(
        "seconds a client may take to send a whole request body after its headers; then 408", minimum=1))
    keep_alive_timeout: int = field(default=5, metadata=_flag(
        "seconds an idle kept-alive connection stays open between requests (uvicorn's timeout_keep_alive)",
        minimum=1))
    limit_concurrency: int = field(default=512, metadata=_flag(
        "most connections open at once; a request arriving while more are open gets 503 "
        "(uvicorn's limit_concurrency, answered as an OpenAI error); /health and /metrics are exempt", minimum=1))
    max_connections_per_client: int = field(default=128, metadata=_flag(
        "most connections one client address may hold open; more are answered 503 and closed, so one "
        "client cannot fill --limit-concurrency alone (raise it behind a proxy that funnels all "
        "clients through one address; 0: no cap)", minimum=0))

    # -- CORS (issue 22): off unless --allowed-origins is given; vLLM's flag names ------------------
    allowed_origins: str | None = field(default=None, metadata=_flag(
        "comma-separated origins browser pages may call this server from ('*': any), answered through "
        "CORS headers and preflights (which need no API key); also takes vLLM's JSON list form",
        default_help="none: no CORS headers, browsers refuse cross-origin calls"))
    allowed_methods: str = field(default="*", metadata=_flag(
        "comma-separated methods cross-origin requests may use, with --allowed-origins"))
    allowed_headers: str = field(default="*", metadata=_flag(
        "comma-separated request headers cross-origin requests may send, with --allowed-origins"))

    def __post_init__(self) -> None:
        if self.chat_template is not None:
            self.chat_template_text = read_chat_template(self.chat_template)
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError(
                "the API key is empty, which would leave the /v1 routes open; give a key, or unset "
                "SPECDEC_API_KEY and --api-key to run without one"
            )
        if self.api_key is not None and self.api_key != self.api_key.strip():
            raise ValueError("the API key starts or ends with whitespace, which no Authorization header can carry")
        for name in ("allowed_origins", "allowed_methods", "allowed_headers"):
            value = getattr(self, name)
            if value is not None and not split_list(value):
                raise ValueError(f"--{name.replace('_', '-')} names nothing; give a comma-separated list, or '*'")
        if self.allowed_hosts is not None and not _split_hosts(self.allowed_hosts):
            raise ValueError("--allowed-hosts names no host; give host names, or '*' for any")

    @property
    def chat_template_name(self) -> str:
        """The template a request renders with, as an error names it."""
        if self.chat_template is None:
            return "The model's chat template"
        if self.chat_template_text == self.chat_template:
            return "The --chat-template template"
        return f"The chat template {self.chat_template}"

    @property
    def host_allowlist(self) -> frozenset[str] | None:
        """Host names (lowercase, no port) the Host header may carry; ``None``: any.

        The default depends on the bind address: a server on a loopback address can only be
        reached from this machine, so the only legitimate names are loopback ones, and anything else
        in Host is a page on another site whose DNS name was rebound to 127.0.0.1. A server bound to
        other addresses is reached under names it cannot know (container, service, proxy names).
        """
        if self.allowed_hosts is not None:
            hosts = _split_hosts(self.allowed_hosts)
            return None if "*" in hosts else hosts
        if _is_loopback(self.host):
            return frozenset({"localhost", "127.0.0.1", "::1", self.host.lower().strip("[]")})
        return None

    @property
    def cors(self) -> dict[str, list[str]] | None:
        """``CORSMiddleware``'s lists, or None when CORS is off (no ``--allowed-origins``)."""
        if self.allowed_origins is None:
            return None
        return {"allow_origins": split_list(self.allowed_origins), "allow_methods": split_list(self.allowed_methods),
                "allow_headers": split_list(self.allowed_headers)}

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def __repr__(self) -> str:  # never print the key (settings end up in logs and tracebacks)
        key = "'***'" if self.api_key else "None"
        return (
            f"ServerSettings(engine={self.engine!r}, host={self.host!r}, port={self.port}, api_key={key}, "
            f"served_model_name={self.served_model_name!r}, max_queue={self.max_queue}, "
            f"log_level={self.log_level!r}, shutdown_grace_s={self.shutdown_grace_s}, "
            f"allowed_hosts={self.allowed_hosts!r}, header_timeout={self.header_timeout}, "
            f"body_timeout={self.body_timeout}, keep_alive_timeout={self.keep_alive_timeout}, "
            f"limit_concurrency={self.limit_concurrency}, "
            f"max_connections_per_client={self.max_connections_per_client}, "
            f"allowed_origins={self.allowed_origins!r})"
        )


def read_chat_template(value: str) -> str:
    """``--chat-template``'s template: the file ``value`` names, else ``value`` itself when it is
    Jinja (vLLM and llama.cpp accept both forms). A value that is neither is refused at start, so a
    mistyped path is not served as a template that renders the path."""
    path = Path(value).expanduser()
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"--chat-template: cannot read {path}: {exc}") from None
    elif "{{" in value or "{%" in value:
        text = value
    else:
        raise ValueError(f"--chat-template: {value!r} is neither a file nor a Jinja template (no '{{{{' or '{{%')")
    if not text.strip():
        raise ValueError("--chat-template: the template is empty")
    return text


def _split_hosts(text: str) -> frozenset[str]:
    """``"a.example, B.example."`` -> ``{"a.example", "b.example"}`` (DNS names are case-insensitive
    and may end in a dot; IPv6 literals may come bracketed)."""
    return frozenset(h.strip().lower().rstrip(".").strip("[]") for h in text.split(",") if h.strip())


def split_list(text: str) -> list[str]:
    """A comma-separated flag value as a list; vLLM's JSON list form (``'["*"]'``) is read too, so
    a command line written for vLLM works unchanged."""
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            items = json.loads(stripped)
        except ValueError:
            raise ValueError(f"{text!r} is neither a comma-separated list nor a JSON list of strings") from None
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise ValueError(f"{text!r} is not a JSON list of strings")
        return [i.strip() for i in items if i.strip()]
    return [item.strip() for item in text.split(",") if item.strip()]


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
