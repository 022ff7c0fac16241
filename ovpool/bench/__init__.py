"""``ovpool bench``: start-up, single stream, a concurrency sweep through the broker, broker
overhead, and OpenVINO GenAI's pipelines on the same GGUF in the same run (see ovpool.cli.bench)."""
