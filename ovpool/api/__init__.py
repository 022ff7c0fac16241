"""The OpenAI-compatible HTTP API (`ovpool api`): a Starlette app that serves the pool through AsyncClient.

schema.py checks request bodies, responses.py builds the response objects, errors.py maps the
error tree to HTTP statuses, sse.py frames streams, streams.py merges n streams and watches for
disconnects, app.py routes, server.py runs uvicorn. Nothing here imports the worker or the broker.
"""
