"""``ovpool serve``: one broker and one worker process per device on this host, supervised.

supervisor.py decides (pure logic); child.py owns one child process; pool.py runs the loop that
connects them.
"""
