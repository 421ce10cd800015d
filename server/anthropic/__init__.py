"""The Anthropic Messages API (``/v1/messages``): its request schema, the translation into chat's
request, and its message object and event stream. The route is ``server.routes.messages``."""
