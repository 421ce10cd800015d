"""The request bodies of ``/v1/completions`` and ``/v1/chat/completions`` as pydantic models.

Each field's type and bounds are declared once, in these modules; validation, the 400 a client
gets (see ``server.api.parsing``) and the served OpenAPI document (``server.routes.openapi_document``)
all come from these declarations. ``base`` holds the shared configuration and field types,
``generation`` what both endpoints share (and the one mapping to ``SamplingParams``),
``completions`` and ``chat`` one endpoint each; the tools' own fields live with the tool-calling
feature (``server.tools.schema``).
"""
