"""The API-neutral floor of the server: what every API's schemas and answers share.

``schema_base`` (strict pydantic configuration and the shared field types), ``limits`` (the
operator's caps, checked while a body validates), ``parsing`` (a body to a model, or one clear
400), ``response_types`` (the answers' JSON shapes) and ``speculative`` (the report beside usage).
Nothing here knows one API from another, and it imports nothing of the server above ``http``.
"""
