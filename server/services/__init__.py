"""The process's services, one instance each, owned by ``server.state``: the engine host (the
engine in its own thread, or one in startup), the grammar pool (constraints compiled off the
event loop), the template pool (chat templates rendered under a time and output budget) and the
response store (the Responses API's stored responses). They sit below ``state`` and know nothing
of any API."""
