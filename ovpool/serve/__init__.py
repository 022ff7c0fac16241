"""``ovpool serve``: one broker and one worker process per device on this host, supervised.

supervisor.py decides (pure logic); child.py owns one child process; service.py supervises the
broker and HTTP API children; pool.py runs the loop that connects them. preflight.py (with
ports.py) checks what no restart fixes before any child starts; keys.py gives each child its
CURVE keys (closed by default).
"""
