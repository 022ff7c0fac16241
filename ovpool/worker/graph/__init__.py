"""Graph building: GGUF weights and hyper-parameters -> OpenVINO graphs (stateful, paged, decode),
and loading them through the compiled-model cache."""
