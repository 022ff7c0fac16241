"""Text: tokenizers read from GGUF metadata (BPE, SentencePiece) and chat templates."""
