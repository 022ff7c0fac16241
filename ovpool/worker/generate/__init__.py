"""Generation: sampling, continuous-batching scheduler, sessions and the batched loop."""
