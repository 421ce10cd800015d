"""The process's services, one instance each, owned by ``server.state``: the engine host (the
engine in its own thread, or one in startup), the grammar pool (constraints compiled off the
event loop) and the response store (the Responses API's stored responses). They sit below
``state`` and know nothing of any API."""
