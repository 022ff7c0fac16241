"""The HTTP API (`ovpool api`): a Starlette app that serves the pool through AsyncClient, in
OpenAI's chat and completions, OpenAI's Responses and Anthropic's Messages dialects.

schema.py checks request bodies, responses.py builds the OpenAI response objects, dialect.py is
what the dialects share (openai_responses.py and anthropic.py translate to and from the chat core),
models.py answers /v1/models, errors.py maps the error tree to HTTP statuses, sse.py frames streams,
streams.py merges n streams and watches for disconnects, app.py routes, server.py runs uvicorn.
Nothing here imports the worker or the broker.
"""
